"""ringtrain's stand-in for the ``horovod`` package (see ``ringtrain.shim``).

Only what PyTorch users of Horovod import exists: ``horovod.torch``, ``horovod.common``,
``horovod.runner``, ``horovod.run``, and the runners ``horovod.ray`` and ``horovod.spark``.
"""

from __future__ import annotations

from typing import Any

#: The Horovod API level this shim reproduces (scripts sometimes compare it).
__version__ = "0.28.1"


def run(*args: Any, **kwargs: Any) -> Any:
    """``horovod.run(func, args=(), kwargs=None, num_proc=..., hosts=..., ...)`` on ringtrain's launcher."""
    import ringtrain

    return ringtrain.run(*args, **kwargs)
