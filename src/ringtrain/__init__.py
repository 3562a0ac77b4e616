"""ringtrain: data-parallel training for PyTorch.

``import ringtrain as hvd`` gives Horovod's ``horovod.torch`` API, rebuilt on ``torch.distributed``.

The API names are resolved on first use (PEP 562), so ``import ringtrain`` stays cheap for the
command line and for subpackages such as ``ringtrain.env`` that do not need torch.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"

#: The oldest torch release ringtrain runs on (pyproject's ``torch>=``); CI tests it and the newest.
_TORCH_FLOOR: tuple[int, int] = (2, 4)


class _TorchTooOldError(ImportError):
    """The installed torch is older than :data:`_TORCH_FLOOR`."""


def _torch_release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as ``2.4.1+cu121`` or ``2.6.0a0+git1234``."""
    parts = version.split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or "x")
    except (IndexError, ValueError):
        return None  # a build that names itself oddly is not refused on a guess


def _require_torch() -> None:
    """Refuse an old torch here, in one line, instead of deep in the launcher on first use.

    Reads the installed distribution's metadata, not ``torch`` itself, so that ``import ringtrain``
    stays as cheap as before; without torch installed nothing is refused (the subpackages that need
    torch say so when they import it).
    """
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return
    release = _torch_release(version)
    if release is None or release >= _TORCH_FLOOR:
        return
    floor = ".".join(map(str, _TORCH_FLOOR))
    error = _TorchTooOldError(
        f"ringtrain needs torch {floor} or newer; this Python ({sys.executable}) has torch {version}. "
        f"HINT: pip install 'torch>={floor}' (the build for your CUDA or CPU), then run it again.")
    _one_line_if_uncaught(error)
    raise error


def _one_line_if_uncaught(error: BaseException) -> None:
    """Print ``error`` as one line, without a traceback, if nothing catches it (the console script)."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if value is error:
            print(f"ringtrain: error: {value}", file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = hook


_require_torch()

# name -> module that defines it (a module path alone means the name is that submodule)
_EXPORTS: dict[str, str] = {
    **dict.fromkeys((
        # lifecycle / topology
        "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank",
        "cross_rank", "is_homogeneous",
        # build / runtime queries
        "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
        "ddl_built", "ccl_built", "cuda_built", "rocm_built",
        # reduce ops
        "Average", "Sum", "Adasum", "Min", "Max", "Product",
        # collectives
        "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
        "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async",
        "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
        "broadcast", "broadcast_async", "broadcast_", "broadcast_async_",
        "alltoall", "alltoall_async",
        "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
        "join", "barrier", "poll", "synchronize",
        "start_timeline", "stop_timeline",
    ), "ringtrain.mpi_ops"),
    **dict.fromkeys(("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"),
                    "ringtrain.process_sets"),
    **dict.fromkeys(("broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                     "allgather_object"), "ringtrain.functions"),
    "DistributedOptimizer": "ringtrain.optimizer",
    # beyond Horovod: Local SGD and DiLoCo (ranks average every sync_every steps)
    "LocalSGD": "ringtrain.local_sgd",
    "Compression": "ringtrain.compression",
    "SyncBatchNorm": "ringtrain.sync_batch_norm",
    "HorovodInternalError": "ringtrain.exceptions",
    "elastic": "ringtrain.elastic",
    # beyond Horovod: the Trainer of ringtrain.train
    **dict.fromkeys(("Trainer", "TrainerConfig"), "ringtrain.train"),
    # beyond Horovod: a graceful stop on a scheduler's signal (docs/preemption.md)
    **dict.fromkeys(("stop_requested", "PREEMPTED_EXIT"), "ringtrain.train.preemption"),
    # beyond Horovod: snapshots written beside training, loaded verified (docs/restarts.md)
    **dict.fromkeys(("save_snapshot", "load_snapshot"), "ringtrain.train.background_snapshots"),
}


def run(*args: Any, **kwargs: Any) -> Any:
    """Run ``func(*args)`` on ``np`` new processes and return their results (``horovod.run``).

    Same arguments as ``horovod.run(func, args=(), kwargs=None, num_proc=..., hosts=..., ...)``; the
    launcher lives in :mod:`ringtrain.launch.api`.
    """
    from ringtrain.launch.api import run as launch_run

    return launch_run(*args, **kwargs)


#: Names beyond Horovod's ``horovod.torch`` surface (the shim leaves them out).
NOT_HOROVOD: frozenset[str] = frozenset({"run", "Trainer", "TrainerConfig", "stop_requested",
                                         "PREEMPTED_EXIT", "LocalSGD", "save_snapshot", "load_snapshot"})

__all__ = sorted([*_EXPORTS, "run"])


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'ringtrain' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"ringtrain.{name}" else getattr(module, name)
    globals()[name] = value  # cache: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
