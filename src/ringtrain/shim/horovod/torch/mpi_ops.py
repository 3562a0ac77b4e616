"""``horovod.torch.mpi_ops``: the very module ``ringtrain.mpi_ops`` (aliased, not copied)."""

import sys

import ringtrain.mpi_ops

sys.modules[__name__] = ringtrain.mpi_ops
