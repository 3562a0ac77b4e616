"""Whether ``DistributedOptimizer`` starts each bucket's allreduce during the backward pass.

Overlap pays when communication waits on something other than this host's CPUs: a GPU's copy engines
and NCCL, or a network link whose transfer time can hide behind the computation of earlier layers.
It costs when every rank runs on this host and the ranks' compute threads already take every core:
an allreduce over loopback is then nothing but the CPU copying and adding, so starting it early only
makes the engine thread and the compute threads take turns on the same cores (context switches, a
colder cache) while the total CPU work stays the same. Measured on a 2-core VM with 2 ranks x 1 thread
(``benchmarks/setting_bench.py``, then named overlap_bench.py, 5 repeats): sending every bucket
after the backward pass trained the MNIST CNN (1.7 MB of gradients) 1.027x [1.001-1.039] as fast
as overlapping, and ResNet-18 (45 MB) 1.014x [0.976-1.034].

``RINGTRAIN_OVERLAP``: ``auto`` (the default) decides with :func:`should_overlap`; ``on`` and ``off``
force it. The buckets, their order and so the results are the same either way: only when each
allreduce starts changes.
"""

from __future__ import annotations


def should_overlap(setting: str, *, world_size: int, local_size: int, threads: int, cores: int,
                   on_gpu: bool) -> bool:
    """The ``auto`` policy (and the ``on``/``off`` overrides) for one rank.

    ``threads`` is each rank's compute threads (``torch.get_num_threads()``), ``cores`` the cores this
    process may use, ``on_gpu`` whether the gradients live on a GPU.
    """
    if setting == "on":
        return True
    if setting == "off":
        return False
    if on_gpu or world_size > local_size:
        return True  # the transfer waits on a device or a link, not on these cores
    return local_size * threads < cores  # a core is left for the communication
