"""``ringtrain check``: a self-test of a job. Is every collective correct, how fast is allreduce here,
and how do its hosts differ?

It runs under any launcher (``ringtrain run``, ``srun``, ``mpirun``, torchrun, or alone), through
ringtrain's Horovod-compatible API (``import ringtrain as hvd``), never through ``torch.distributed``
directly: the point is to test the stack a training script will use.

- :mod:`ringtrain.check.report`: the records of one rank's report, and the grouping of ranks by host;
- :mod:`ringtrain.check.collectives`: every collective against a value each rank recomputes, and the
  allreduce bandwidth sweep;
- :mod:`ringtrain.check.hosts`: across hosts, where each rank runs, the bandwidth of each pair of
  hosts, and warnings about hosts whose versions or clocks differ;
- :mod:`ringtrain.check.machine`: this rank's API, backends, GPUs, device and control plane.

The names the command uses are gathered here, so ``from ringtrain import check`` is its whole interface.
"""

from ringtrain.check.collectives import (
    ALLREDUCE_OPS,
    DEFAULT_BANDWIDTH_SIZES,
    count_failures_everywhere,
    measure_allreduce_bandwidth,
    run_collective_checks,
)
from ringtrain.check.hosts import gather_hosts, host_warnings, measure_links, reached_on
from ringtrain.check.machine import load_api, new_report, pick_device
from ringtrain.check.report import CheckReport, CheckResult, hello_line

__all__ = [
    "ALLREDUCE_OPS",
    "DEFAULT_BANDWIDTH_SIZES",
    "CheckReport",
    "CheckResult",
    "count_failures_everywhere",
    "gather_hosts",
    "hello_line",
    "host_warnings",
    "load_api",
    "measure_allreduce_bandwidth",
    "measure_links",
    "new_report",
    "pick_device",
    "reached_on",
    "run_collective_checks",
]
