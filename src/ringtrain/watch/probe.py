"""The rank's side of the watch: a thread that writes this rank's progress to a file once a second.

It reads counters that already exist and copies nothing big:

- torch's default process group: how many collectives it issued (``_get_sequence_number_for_group``),
  and, when that number has not moved since the last look, the newest entry of torch's flight recorder
  (the collective's name, its sizes) where this torch keeps one for the group;
- the Horovod engine of this process, when one runs: how many requests it finished and the names it
  has pending;
- where the main thread is: the innermost frame outside ringtrain, torch and the standard library.

Each record replaces the last one through a temporary file and a rename, so the agent never reads
half a record. On request (a ``stacks`` file naming a request number) the thread writes every
thread's stack once. The thread is a daemon and never raises. It is stopped and joined when the
interpreter exits (an ``atexit`` callback): torch's bindings release the GIL, and a daemon thread that
comes back into a finalizing interpreter from one of them is unwound through C++ code that may not
be unwound, which aborts the whole process ("terminate called without an active exception") after
the script has finished well.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

#: Set by the agent for its ranks: the folder the probes write into (no variable: no probe).
WATCH_DIR_VARIABLE = "RINGTRAIN_WATCH_DIR"
#: Seconds between two records.
INTERVAL_S = 1.0
PROBE_THREAD = "ringtrain-watch"
#: Arrival times a record carries: the newest, so that a record the agent missed loses none.
ARRIVALS_KEPT = 256
#: The agent's request for stacks: a file holding a request number.
STACKS_REQUEST = "stacks.request"
#: How long the interpreter's exit waits for the probe to finish the record it is writing.
JOIN_TIMEOUT_S = 5.0

_LIBRARY_ROOTS = tuple(
    os.path.normpath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]} if p)
_HIDDEN_PARTS = (f"{os.sep}torch{os.sep}", f"{os.sep}ringtrain{os.sep}", f"{os.sep}horovod{os.sep}",
                 "<frozen ")


def record_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"rank-{rank}.json"


def stacks_path(folder: str | Path, rank: int) -> Path:
    return Path(folder) / f"stacks-{rank}.txt"


def is_users(filename: str) -> bool:
    """Whether a frame of this file is the user's: not ringtrain's, torch's or the standard library's."""
    if any(part in filename for part in _HIDDEN_PARTS):
        return False
    normal = os.path.normpath(filename)
    return not normal.startswith(_LIBRARY_ROOTS) or "site-packages" in normal


def is_library(filename: str) -> bool:
    """Whether a frame of this file is inside torch, ringtrain or Horovod (a collective, backward): not
    the standard library, whose waits (a lock, a sleep) are the script's own."""
    return any(part in filename for part in _HIDDEN_PARTS[:3])


def line_of(frame: FrameType) -> int:
    """The line ``frame`` runs; its function's first line while it runs an instruction that belongs to
    no line (``f_lineno`` is then None, as it may be in a frame read from another thread)."""
    line = frame.f_lineno
    return line if line is not None else frame.f_code.co_firstlineno


def user_frame(frame: FrameType | None) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of the user's code in ``frame``'s stack."""
    while frame is not None:
        code = frame.f_code
        if is_users(code.co_filename):
            return code.co_filename, line_of(frame), code.co_name
        frame = frame.f_back
    return None


def innermost(frame: FrameType | None) -> tuple[str, int, str] | None:
    if frame is None:
        return None
    return frame.f_code.co_filename, line_of(frame), frame.f_code.co_name


def all_stacks() -> str:
    """Every Python thread's stack, the main thread first (each innermost call last)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    frames = sys._current_frames()
    parts = []
    for ident in sorted(frames, key=lambda i: (i != main, i)):
        if names.get(ident) == PROBE_THREAD:
            continue  # the probe itself
        stack = "".join(traceback.format_list(_without_launcher(traceback.extract_stack(frames[ident]))))
        parts.append(f"Thread {names.get(ident, ident)!s} ({'main' if ident == main else 'other'}):\n{stack}")
    return "\n".join(parts)


def _without_launcher(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """The stack from the user's script on: the frames of runpy and of the rank's entry point before
    it are ours, not the user's (the same cut as the failure report's tracebacks)."""
    frames = list(stack)
    for i, frame in enumerate(frames):
        name = frame.filename
        if name.endswith(("worker_entry.py", "runpy.py")) or name.startswith("<frozen runpy"):
            continue
        return frames[i:] if i else frames
    return frames


def _write_atomically(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_text(text)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            temp.unlink()


class TorchGroup:
    """The default torch process group's counter and newest collective, read without side effects."""

    def __init__(self) -> None:
        self._dump: Any = None
        self._looked_for_dump = False

    def sequence(self) -> int | None:
        dist = sys.modules.get("torch.distributed")
        if dist is None:
            return None
        try:
            if not dist.is_initialized():
                return None
            group = dist.distributed_c10d._get_default_group()
            return int(group._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - a torch without the counter, a group being torn down
            return None

    def entries(self) -> list[dict[str, Any]] | None:
        """The flight recorder's entries of the default group (None: this torch keeps none)."""
        if not self._looked_for_dump:
            self._looked_for_dump = True
            c10d = sys.modules.get("torch._C._distributed_c10d")
            self._dump = getattr(c10d, "_dump_fr_trace_json", None)
        if self._dump is None:
            return None
        try:
            entries = json.loads(self._dump(includeCollectives=True, onlyActive=False)).get("entries", [])
        except Exception:  # noqa: BLE001 - no recorder for this group or backend
            return None
        try:
            name = str(sys.modules["torch.distributed"].distributed_c10d._get_default_group().group_name)
        except Exception:  # noqa: BLE001 - the group went away meanwhile
            return None
        # The recorder is shared by every group this process ever had: the default group's entries
        # are those of its name with the newest group id (a group made again after a destroy has a
        # new id and counts its collectives from 1 again).
        ours = [e for e in entries if (e.get("process_group") or [None])[0] == name and not e.get("is_p2p")]
        newest = max((int(e.get("pg_id", 0)) for e in ours), default=0)
        return [e for e in ours if int(e.get("pg_id", 0)) == newest]

    @staticmethod
    def newest(entries: list[dict[str, Any]], sequence: int) -> dict[str, Any] | None:
        """Collective ``sequence``'s name and sizes among ``entries``."""
        # the newest match: the recorder is a ring shared by every group this process ever had, so an
        # earlier group (destroyed, then made again) may have left an entry under the same number
        matches = [e for e in entries if e.get("collective_seq_id") == sequence]
        if not matches:
            return None
        entry = max(matches, key=lambda e: (int(e.get("time_created_ns") or 0), int(e.get("record_id") or 0)))
        name = str(entry.get("profiling_name", "")).rpartition(":")[2] or "collective"
        return {"op": name, "sizes": entry.get("input_sizes")}

    @staticmethod
    def arrivals(entries: list[dict[str, Any]]) -> list[tuple[int, float]]:
        """(collective number, when this rank issued it, in seconds since the epoch) of ``entries``."""
        return [(int(e["collective_seq_id"]), int(e["time_created_ns"]) / 1e9) for e in entries
                if e.get("collective_seq_id") is not None and e.get("time_created_ns")]


def engine_state() -> dict[str, Any] | None:
    """The Horovod engine's finished count and pending names (None: no engine in this process)."""
    state = sys.modules.get("ringtrain.engine.state")
    engine = getattr(state, "engine", None)
    if engine is None:
        return None
    try:
        pending = [key for _, key in list(engine.controller.pending)]
    except (RuntimeError, AttributeError):  # changed while read: the next record has it
        pending = []
    try:
        arrivals = list(getattr(engine, "arrivals", ()))
    except RuntimeError:  # appended to while copied
        arrivals = []
    return {"done": int(getattr(engine, "completed", 0)), "pending": pending[:8],
            "pending_count": len(pending), "arrivals": arrivals}


class Probe:
    """Writes this rank's record every ``interval`` seconds; see the module's docstring."""

    def __init__(self, folder: str | Path, rank: int, interval: float = INTERVAL_S) -> None:
        self.folder, self.rank, self.interval = Path(folder), rank, interval
        self.torch = TorchGroup()
        self._stop = threading.Event()
        self._last_counters: tuple[Any, ...] | None = None
        self._progress_time = time.time()
        self._collective: dict[str, Any] | None = None
        self._answered = ""
        #: When this rank issued its newest collectives: the agent tells the straggler from them.
        self._arrivals: deque[tuple[int, float]] = deque(maxlen=ARRIVALS_KEPT)
        self._newest_sent = -1

    def record(self, now: float | None = None) -> dict[str, Any]:
        """This rank's record now (also updates when it last made progress)."""
        now = time.time() if now is None else now
        sequence = self.torch.sequence()
        engine = engine_state()
        counters = (sequence, engine["done"] if engine else None, engine["pending_count"] if engine else None)
        moved = counters != self._last_counters
        if moved:
            self._last_counters = counters
            self._progress_time = now
            self._collective = None
        if sequence and (moved or self._collective is None):
            # one dump a second while collectives run (about a millisecond), none while nothing moves
            entries = self.torch.entries()
            if entries is not None:
                if moved:
                    self._arrivals.extend(a for a in self.torch.arrivals(entries) if a[0] > self._newest_sent)
                    self._newest_sent = max((a[0] for a in self._arrivals), default=self._newest_sent)
                else:
                    self._collective = self.torch.newest(entries, sequence) or {}
        main = sys._current_frames().get(threading.main_thread().ident or 0)
        return {"rank": self.rank, "pid": os.getpid(), "time": now, "progress_time": self._progress_time,
                "sequence": sequence, "collective": self._collective or None, "engine": engine,
                "where": user_frame(main), "innermost": innermost(main), "arrivals": list(self._arrivals)}

    def write_once(self) -> None:
        _write_atomically(record_path(self.folder, self.rank), json.dumps(self.record()))
        self._answer_stacks()

    def _answer_stacks(self) -> None:
        try:
            request = (self.folder / STACKS_REQUEST).read_text().strip()
        except OSError:
            return
        if request and request != self._answered:
            self._answered = request
            _write_atomically(stacks_path(self.folder, self.rank), f"request {request}\n{all_stacks()}")

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.write_once()
            except Exception:  # noqa: BLE001 - the watch must never end or disturb the rank
                continue

    def stop(self) -> None:
        self._stop.set()

    def stop_and_join(self, thread: threading.Thread, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Stop the probe and wait until ``thread`` (running :meth:`run`) is out of every torch call."""
        self.stop()
        if thread is not threading.current_thread():
            thread.join(timeout)


def start(environ: Mapping[str, str] | None = None, interval: float = INTERVAL_S) -> Probe | None:
    """Start this rank's probe when its agent asked for one (``RINGTRAIN_WATCH_DIR``)."""
    environ = os.environ if environ is None else environ
    folder = environ.get(WATCH_DIR_VARIABLE)
    rank = environ.get("RANK")
    if not folder or rank is None or not os.path.isdir(folder):
        return None
    probe = Probe(folder, int(rank), interval)
    thread = threading.Thread(target=probe.run, name=PROBE_THREAD, daemon=True)
    thread.start()
    # before the interpreter finalizes: see the module's docstring
    atexit.register(probe.stop_and_join, thread)
    return probe
