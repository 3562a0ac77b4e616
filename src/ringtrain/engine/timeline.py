"""Timeline: a Chrome-trace JSON file (rank 0) with negotiation and execution phases per tensor.

Open it in chrome://tracing or https://ui.perfetto.dev. Each tensor name gets its own row (``tid``);
phases are ``NEGOTIATE_<OP>`` (from the first local sighting until all ranks agreed) and ``<OP>``
(execution on the data group).
"""

from __future__ import annotations

import json
import threading
import time
from typing import IO


class Timeline:
    """Writes trace events; every method is a no-op while no file is open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._tids: dict[str, int] = {}
        self._start = time.perf_counter()
        self.mark_cycles = False

    @property
    def active(self) -> bool:
        return self._file is not None

    def start(self, path: str, mark_cycles: bool = False) -> None:
        with self._lock:
            self._close_locked()
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - kept open until stop()
            self._file.write("[\n")
            self._first = True
            self._tids = {}
            self.mark_cycles = mark_cycles

    def stop(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._file is not None:
            self._file.write("\n]\n")
            self._file.close()
            self._file = None

    def _emit(self, event: dict) -> None:
        assert self._file is not None
        self._file.write(("" if self._first else ",\n") + json.dumps(event))
        self._first = False

    def _tid(self, name: str) -> int:
        tid = self._tids.get(name)
        if tid is None:
            tid = self._tids[name] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}})
        return tid

    def begin(self, name: str, phase: str) -> None:
        self._event(name, phase, "B")

    def end(self, name: str, phase: str) -> None:
        self._event(name, phase, "E")

    def cycle(self) -> None:
        if self.mark_cycles:
            self._event("CYCLE", "CYCLE_START", "i")

    def _event(self, name: str, phase: str, kind: str) -> None:
        if self._file is None:
            return
        with self._lock:
            if self._file is None:
                return
            ts = (time.perf_counter() - self._start) * 1e6
            self._emit({"name": phase, "ph": kind, "ts": round(ts, 1), "pid": 1, "tid": self._tid(name)})
