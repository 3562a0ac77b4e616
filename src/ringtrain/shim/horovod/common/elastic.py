"""``horovod.common.elastic``: the elastic state base classes and the retry loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringtrain.elastic import run as _torch_run
from ringtrain.elastic import run_fn as _run_fn
from ringtrain.elastic.state import ObjectState, State  # noqa: F401


def run_fn(func: Callable[..., Any], reset: Callable[[], None] | None) -> Callable[..., Any]:
    """Wrap ``func(state, ...)`` in the elastic retry loop, calling ``reset()`` to re-initialize."""
    return _torch_run(func) if reset is None else _run_fn(func, reset)
