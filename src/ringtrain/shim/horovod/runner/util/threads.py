"""``horovod.runner.util.threads``: start a function in a background thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def in_thread(target: Callable[..., Any], args: tuple[Any, ...] = (), name: str | None = None,
              daemon: bool = True, silent: bool = False) -> threading.Thread:
    """Start ``target(*args)`` in a new thread and return the thread.

    With ``silent=True`` an exception in ``target`` ends the thread quietly instead of being printed.
    """

    def body(*call_args: Any) -> None:
        try:
            target(*call_args)
        except BaseException:
            if not silent:
                raise

    thread = threading.Thread(target=body, args=args, name=name, daemon=daemon)
    thread.start()
    return thread
