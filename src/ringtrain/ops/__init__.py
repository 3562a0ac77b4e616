"""Horovod's collectives, one module per op family (:mod:`ringtrain.ops.allreduce`, ...).

:mod:`ringtrain.mpi_ops` gathers them under Horovod's names; scripts import it as
``horovod.torch.mpi_ops`` or through ``import ringtrain as hvd``. The families share
:mod:`ringtrain.op_requests`, which turns a call into an engine request and waits for it; it sits
outside this package, below :mod:`ringtrain.process_sets` as these modules do above it, so that the
two never import each other.
"""
