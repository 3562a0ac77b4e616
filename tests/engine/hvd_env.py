"""Helpers for tests that run the Horovod API inside real ranks."""

from __future__ import annotations

import os
from collections.abc import Mapping

#: Variables the engine reads at init; cleared before each fresh init so tests do not leak settings.
ENGINE_VARIABLES = (
    "HOROVOD_CACHE_CAPACITY",
    "HOROVOD_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME",
    "HOROVOD_TIMELINE",
    "HOROVOD_TIMELINE_MARK_CYCLES",
    "HOROVOD_STALL_CHECK_TIME_SECONDS",
    "HOROVOD_STALL_CHECK_DISABLE",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
    "HOROVOD_DYNAMIC_PROCESS_SETS",
    "RINGTRAIN_EAGER_ELEMENTS",
    "RINGTRAIN_CONTROL_PLANE",
    "RINGTRAIN_CPU_ALLREDUCE",
    "RINGTRAIN_OVERLAP",
    "HOROVOD_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_HIERARCHICAL_ALLGATHER",
)


def fresh(env: Mapping[str, str] | None = None, **init_kwargs: object) -> None:
    """Shut down whatever ran before and init again with exactly ``env`` set."""
    import ringtrain.mpi_ops as hvd
    from ringtrain.engine import state

    hvd.shutdown()
    state.dynamic_sets = False
    for name in ENGINE_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(env or {})
    hvd.init(**init_kwargs)


def ensure_init(keep_settings: bool = False) -> None:
    """Init with default settings unless an engine (with default settings) is already running."""
    import ringtrain.mpi_ops as hvd

    if hvd.is_initialized() and (keep_settings or not any(name in os.environ for name in ENGINE_VARIABLES)):
        return
    fresh()
