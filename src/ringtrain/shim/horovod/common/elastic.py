"""``horovod.common.elastic``: the elastic state base classes and the retry loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringtrain.elastic import run as _torch_run
from ringtrain.elastic.state import ObjectState, State  # noqa: F401
from ringtrain.exceptions import HorovodInternalError, HostsUpdatedInterrupt


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Wrap ``func(state, ...)`` in the elastic retry loop, calling ``reset()`` to re-initialize."""
    import functools

    if reset is None:
        return _torch_run(func)

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
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
