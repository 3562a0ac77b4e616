"""Handles: the integers that ``*_async`` calls return, and what ``poll``/``synchronize`` wait on."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any, SupportsIndex


class Handle:
    """Completion state of one submitted request (or group)."""

    __slots__ = ("done", "driving", "error", "error_type", "finish", "keepalive", "outputs", "result")

    def __init__(self, finish: Callable[[Any], Any] | None = None) -> None:
        self.done = threading.Event()
        self.error: str | None = None
        self.error_type: type[BaseException] | None = None
        self.outputs: Any = None
        # Converts raw outputs into what synchronize() returns (tuple for groups, ...).
        self.finish = finish
        self.result: Any = None
        # A user thread is (or is about to be) running rounds until this handle completes.
        self.driving = False
        # Inputs stay referenced until synchronize(), as in Horovod.
        self.keepalive: Any = None


class HandleManager:
    """Allocates handle numbers (also used for ``noname`` op names) and keeps live handles."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._handles: dict[int, Handle] = {}

    def allocate(self, finish: Callable[[Any], Any] | None = None) -> tuple[int, Handle]:
        """A fresh handle number and its state."""
        with self._lock:
            number = self._next
            self._next += 1
            handle = Handle(finish)
            self._handles[number] = handle
            return number, handle

    def peek_next(self) -> int:
        """The number the next :meth:`allocate` will return."""
        with self._lock:
            return self._next

    def issued(self, number: object) -> bool:
        """Whether ``number`` was handed out by :meth:`allocate` (live or already cleared)."""
        if not isinstance(number, SupportsIndex):
            return False
        try:
            value = operator.index(number)
        except TypeError:  # an __index__ that returns no int
            return False
        with self._lock:
            return 0 <= value < self._next

    def get(self, number: int) -> Handle | None:
        with self._lock:
            return self._handles.get(number)

    def pop(self, number: int) -> Handle | None:
        with self._lock:
            return self._handles.pop(number, None)

    def discard(self, number: int) -> None:
        with self._lock:
            self._handles.pop(number, None)

    def fail_all(self, message: str, error_type: type[BaseException]) -> None:
        """Complete every unfinished handle with an error (engine stopped or broken)."""
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            if not handle.done.is_set():
                handle.error = message
                handle.error_type = error_type
                handle.done.set()
