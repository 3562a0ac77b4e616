"""Process-wide engine state shared by ``mpi_ops`` and ``process_sets`` (one engine per process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringtrain.engine.background import Engine

#: The running engine, or None before init / after shutdown.
engine: Engine | None = None
#: init(process_sets="dynamic") was called.
dynamic_sets = False
#: Registered ProcessSet objects by id (id 0 is the global set).
registered: dict[int, Any] = {}

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


def require() -> Engine:
    """The engine, or Horovod's not-initialized ValueError."""
    if engine is None:
        raise ValueError(NOT_INITIALIZED)
    return engine
