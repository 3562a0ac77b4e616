"""``horovod.runner``: ``run`` starts a function on many processes (ringtrain's launcher)."""

from __future__ import annotations

from typing import Any


def run(*args: Any, **kwargs: Any) -> Any:
    """``horovod.runner.run(func, args=(), kwargs=None, num_proc=..., hosts=..., ...)``."""
    import ringtrain

    return ringtrain.run(*args, **kwargs)
