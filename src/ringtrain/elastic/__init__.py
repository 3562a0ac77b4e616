"""Elastic training: keep a job going when a rank fails or hosts change.

``@elastic.run`` wraps ``train(state, ...)``: it syncs ``state`` from rank 0, calls the function, and
on ``HorovodInternalError`` (a peer died) restores the last commit, re-initializes and retries; on
``HostsUpdatedInterrupt`` it re-initializes without restoring. Outside an elastic launch it is simply
"sync, then call".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ringtrain import mpi_ops
from ringtrain.elastic.sampler import ElasticSampler
from ringtrain.elastic.state import ObjectState, State, TorchState, get_handler_registry, set_handler_registry
from ringtrain.exceptions import HorovodInternalError, HostsUpdatedInterrupt

R = TypeVar("R")


def _reset() -> None:
    mpi_ops.shutdown()
    mpi_ops.init()


def run_fn(func: Callable[..., R], reset: Callable[[], None]) -> Callable[..., R]:
    """Wrap ``func(state, *args, **kwargs)`` in the retry loop, calling ``reset()`` to re-initialize."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        skip_sync = False
        while True:
            if not skip_sync:
                state.sync()
            try:
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
            reset()
            state.on_reset()

    return wrapper


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)`` so it resumes from ``state`` after a reset."""
    return run_fn(func, _reset)


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "get_handler_registry", "run",
           "run_fn", "set_handler_registry"]
