"""Elastic training: keep a job going when a rank fails or hosts change.

``@elastic.run`` wraps ``train(state, ...)``: it syncs ``state`` from rank 0, calls the function, and
on ``HorovodInternalError`` (a peer died) restores the last commit, re-initializes and retries; on
``HostsUpdatedInterrupt`` it re-initializes without restoring. A failure while syncing is handled the
same way. Under ``ringtrain run --min-np/--max-np/--host-discovery-script`` re-initializing joins the
driver's next generation of the group (see docs/elastic.md), and ``state`` hears about host updates
from the driver; a worker that has no place in the new group exits with code 0. Outside an elastic
launch it is simply "sync, then call".
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ringtrain import mpi_ops
from ringtrain.elastic.sampler import ElasticSampler
from ringtrain.elastic.state import ObjectState, State, TorchState, get_handler_registry, set_handler_registry
from ringtrain.engine import elastic_rendezvous
from ringtrain.exceptions import ElasticWorkerExit, HorovodInternalError, HostsUpdatedInterrupt

R = TypeVar("R")


def _reset() -> None:
    mpi_ops.shutdown()
    mpi_ops.init()


def run_fn(func: Callable[..., R], reset: Callable[[], None]) -> Callable[..., R]:
    """Wrap ``func(state, *args, **kwargs)`` in the retry loop, calling ``reset()`` to re-initialize."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> R:
        elastic_rendezvous.add_listener(state.on_hosts_updated)
        try:
            skip_sync = False
            while True:
                try:
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError:
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as interrupt:
                    skip_sync = interrupt.skip_sync
                try:
                    reset()
                except ElasticWorkerExit as exc:
                    # Not a crash: the driver re-formed the group without this worker, or ends the job.
                    print(str(exc), file=sys.stderr, flush=True)
                    raise SystemExit(exc.exit_code) from None
                state.on_reset()
        finally:
            elastic_rendezvous.remove_listener(state.on_hosts_updated)

    return wrapper


def run(func: Callable[..., R]) -> Callable[..., R]:
    """Decorate ``func(state, *args, **kwargs)`` so it resumes from ``state`` after a reset."""
    return run_fn(func, _reset)


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "get_handler_registry", "run",
           "run_fn", "set_handler_registry"]
