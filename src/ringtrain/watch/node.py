"""The node agent's side of the watch: read the ranks' records, tell a stuck job once, end it on time.

:class:`NodeWatch` looks once a second (:meth:`NodeWatch.look`). When no rank made progress for the
warning time and some rank waits for another, it asks every rank for its stacks, writes them to one
file, and prints one report naming the ranks waited for first. At the hang timeout it records the
report as the job's root cause (:attr:`NodeWatch.verdict`) and kills the ranks waited for, which ends
the job through the agent's usual failure path (and ``--max-restarts`` then restarts it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ringtrain.watch.diagnosis import (
    DEFAULT_HANG_TIMEOUT_S,
    RankView,
    Stuck,
    WarnTime,
    diagnose,
    format_stuck,
    summary,
)
from ringtrain.watch.probe import STACKS_REQUEST, stacks_path
from ringtrain.watch.stragglers import Arrivals

#: Variables the launcher sets for the agent (and every rank inherits, harmlessly).
HANG_TIMEOUT_VARIABLE = "RINGTRAIN_HANG_TIMEOUT"
WATCH_VARIABLE = "RINGTRAIN_WATCH"
#: Horovod's stall shutdown, which the watch takes over for jobs it watches.
STALL_SHUTDOWN_VARIABLE = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
#: Flight-recorder entries kept per process group when the user did not choose: enough to name the
#: newest collective, small enough to dump in well under a millisecond.
FLIGHT_RECORDER_ENTRIES = "64"
#: Marker lines an agent of a multi-host job writes for its driver (never shown on the console).
WATCH_MARKER = "@@RINGTRAIN_WATCH@@ "
STACKS_MARKER = "@@RINGTRAIN_STACKS@@ "
#: The driver's request for stacks, on an agent's stdin (``stacks ID``).
STACKS_REQUEST_LINE = b"stacks"
#: Seconds between two lines about the same straggler.
STRAGGLER_REPEAT_S = 600.0
#: How long the watch waits for the ranks' stacks.
STACKS_WAIT_S = 3.0


@dataclass(frozen=True)
class WatchSettings:
    """What the launcher asked of the watch."""

    enabled: bool = True
    hang_timeout: float | None = None
    """Seconds without progress that end the job (None: :data:`DEFAULT_HANG_TIMEOUT_S`, and only when
    the ranks waited for are not busy)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WatchSettings:
        enabled = env.get(WATCH_VARIABLE, "1").strip().lower() not in ("0", "false", "off", "no") and \
            env.get("RINGTRAIN_NO_WATCH", "0").strip().lower() not in ("1", "true", "on", "yes")
        text = env.get(HANG_TIMEOUT_VARIABLE)
        if text:
            return cls(enabled=enabled, hang_timeout=parse_hang_timeout(text))
        try:  # Horovod's own knob (0: no shutdown); the engine names a bad value itself
            stall = float(env.get(STALL_SHUTDOWN_VARIABLE) or 0)
        except ValueError:
            stall = 0.0
        return cls(enabled=enabled, hang_timeout=stall if stall > 0 else None)

    def timeout(self) -> float:
        return self.hang_timeout or DEFAULT_HANG_TIMEOUT_S


def parse_hang_timeout(text: str) -> float:
    """Seconds from ``--hang-timeout`` / ``RINGTRAIN_HANG_TIMEOUT``; ValueError names value and fix."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--hang-timeout {text!r} is not a positive number of seconds. HINT: give the "
                         "seconds without progress that end a stuck job, e.g. --hang-timeout 300, or "
                         "--no-watch to turn the watch off.")
    return value


@dataclass(frozen=True)
class Verdict:
    """The report that ends a stuck job, as the root cause of its failure."""

    rank: int
    pid: int
    host: str
    time: float
    message: str
    traceback: str
    hint: str


class ProcessReader:
    """Each rank's state letter and CPU share, from ``/proc`` (unknown elsewhere)."""

    _STATES = {"T": "stopped", "t": "stopped", "D": "disk", "Z": "gone", "X": "gone", "R": "running"}

    def __init__(self, proc: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic) -> None:
        self.proc, self.clock = proc, clock
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: dict[int, tuple[float, float]] = {}

    def read(self, pid: int) -> tuple[str, float | None]:
        try:
            text = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return ("gone" if self.proc.is_dir() else "running"), None
        fields = text[text.rindex(")") + 2:].split()
        state = self._STATES.get(fields[0], "sleeping")
        cpu_s = (int(fields[11]) + int(fields[12])) / self._ticks
        now = self.clock()
        share = None
        if pid in self._last:
            then, used = self._last[pid]
            if now > then:
                share = max(cpu_s - used, 0.0) / (now - then)
        self._last[pid] = (now, cpu_s)
        return state, share


def read_record(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class NodeWatch:
    """The watch of one node's ranks (see the module's docstring)."""

    def __init__(self, folder: str | Path, host: str, pids: Callable[[], Sequence[int]],
                 say: Callable[[str], None], settings: WatchSettings,
                 end: Callable[[Sequence[int]], None] | None = None, *,
                 clock: Callable[[], float] = time.time, processes: ProcessReader | None = None,
                 stacks_wait: float = STACKS_WAIT_S, stacks_dir: str | None = None,
                 relay: Callable[[str], None] | None = None) -> None:
        self.folder, self.host, self.pids, self.say = Path(folder), host, pids, say
        self.relay = relay
        """Where an agent started by a multi-host driver sends its ranks' views (marker lines): that
        driver's watch (:class:`ringtrain.watch.job.JobWatch`) decides over every host's ranks."""
        self._sent: dict[int, set[Any]] = {}
        self.settings = settings
        self.end = end or kill_all
        self.clock = clock
        self.processes = processes or ProcessReader()
        self.stacks_wait = stacks_wait
        self.stacks_dir = stacks_dir or tempfile.gettempdir()
        self.pace = WarnTime()
        self.verdict: Verdict | None = None
        self._told: float | None = None
        """``since`` of the stuck spell already reported (one report per spell)."""
        self.pairs: dict[int, list[tuple[Hashable, float]]] = {}
        self._last_diagnosis: tuple[str, tuple[int, ...]] | None = None
        self._stacks: dict[int, str] = {}
        self._stacks_file: str | None = None
        self._requests = 0
        self.arrivals = Arrivals()
        self._straggler_told: tuple[int, float] | None = None
        self.said_straggler = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- one look -----------------------------------------------------------------------------

    def views(self) -> list[RankView]:
        live = set(self.pids())
        views, records = [], []
        for path in sorted(self.folder.glob("rank-*.json")):
            record = read_record(path)
            if record is None or record.get("pid") not in live:
                continue  # a rank of an earlier attempt, or one that has not written yet
            state, cpu = self.processes.read(int(record["pid"]))
            views.append(RankView.from_record(record, self.host, state, cpu))
            records.append(record)
        self.pairs = {int(record["rank"]): arrival_pairs(record) for record in records}
        ranks = {view.rank for view in views}
        if self.relay is None and len(ranks) > 1 and len(ranks) == len(live):
            for rank, pairs in self.pairs.items():
                self.arrivals.add(rank, pairs, ranks)
        return views

    def send_views(self, views: Sequence[RankView]) -> None:
        """One marker line for the driver: this host's ranks, with how long each has made no progress
        (hosts' clocks differ; a span does not) and the arrivals not sent before."""
        now = self.clock()
        arrivals = {}
        for rank, pairs in self.pairs.items():
            sent = self._sent.setdefault(rank, set())
            new = [pair for pair in pairs if pair[0] not in sent]
            sent.update(key for key, _ in new)
            if len(sent) > 4 * 256:  # keys of long ago: no record carries them again
                self._sent[rank] = {key for key, _ in pairs}
            arrivals[rank] = new
        body = {"host": self.host, "views": [{**asdict(v), "quiet": now - v.progress_time} for v in views],
                "arrivals": arrivals}
        self.relay(WATCH_MARKER + json.dumps(body))  # type: ignore[misc]

    def answer_stacks(self, request: str) -> None:
        """The driver asked for stacks: take them here and send where they are, with each rank's main
        thread (the driver's report quotes the rank it names)."""
        views = self.views()
        path = self.collect_stacks(views)
        body = {"id": request, "host": self.host, "file": path, "main": self._stacks,
                "conditions": {v.rank: v.condition() for v in views}}
        if self.relay is not None:
            self.relay(STACKS_MARKER + json.dumps(body))

    def host_of(self, rank: int) -> str:
        return self.host

    def check_stragglers(self, now: float) -> None:
        """Say so when one rank keeps the others waiting: once, again if another rank takes its place,
        and again every :data:`STRAGGLER_REPEAT_S` while it stays."""
        found = self.arrivals.straggler()
        if found is None:
            return
        told = self._straggler_told
        if told is None or told[0] != found.rank or now - told[1] >= STRAGGLER_REPEAT_S:
            self._straggler_told = (found.rank, now)
            self.said_straggler = True
            self.say(f"ringtrain run: {found.line(self.host_of(found.rank))}")

    def final_summary(self) -> str | None:
        """The run's straggler line for its end (None when no rank kept the others waiting)."""
        found = self.arrivals.summary() if self.said_straggler else None
        return f"ringtrain run: over the whole run, {found.line(self.host_of(found.rank))}" if found else None

    def look(self) -> Stuck | None:
        """Read the records, and report or end a stuck job; returns the diagnosis (None: not stuck)."""
        views = self.views()
        if self.relay is not None:
            self.send_views(views)
            return None
        if not views or self.verdict is not None:
            return None
        for view in views:
            self.pace.saw_progress(view.progress_time)
        now = self.clock()
        self.check_stragglers(now)
        stuck = diagnose(views, now, self.pace.seconds(self.settings.hang_timeout))
        if stuck is None:
            self._last_diagnosis = None
            if self._told is not None and max(v.progress_time for v in views) > self._told:
                self.say(f"ringtrain run: the job makes progress again after "
                         f"{max(v.progress_time for v in views) - self._told:.0f} s without")
                self._told = None
            return None
        if self._told != stuck.since:
            self._told = stuck.since
            self._stacks_file = self.collect_stacks(views)
            self.say(format_stuck(stuck, now, self._stacks_file, self._ending(stuck)))
        # ended only on a diagnosis two looks in a row agree on: one look may see a host's newest
        # line late, and the job must not end naming the wrong rank
        agreed = self._last_diagnosis == (stuck.kind, tuple(v.rank for v in stuck.culprits))
        self._last_diagnosis = (stuck.kind, tuple(v.rank for v in stuck.culprits))
        if agreed and now - stuck.since >= self.settings.timeout() and \
                (self.settings.hang_timeout or not stuck.busy()):
            self._end(stuck, views, now)
        return stuck

    def _ending(self, stuck: Stuck) -> str:
        if self.settings.hang_timeout:
            return (f"the job ends once nothing has moved for {self.settings.hang_timeout:g} s "
                    "(--hang-timeout); --no-watch turns the watch off")
        if stuck.busy():
            return ("the ranks waited for are busy, so the job goes on; --hang-timeout SECONDS ends it "
                    "after that long without progress")
        return (f"the job ends after {DEFAULT_HANG_TIMEOUT_S:g} s without progress; --hang-timeout SECONDS "
                "sets another bound, --no-watch turns the watch off")

    def _end(self, stuck: Stuck, views: Sequence[RankView], now: float) -> None:
        targets = list(stuck.culprits) or list(views)
        first = targets[0]
        hint = (f"every rank's stacks are in {self._stacks_file}. " if self._stacks_file else "") + \
            "A rank that is slow on purpose needs a longer --hang-timeout."
        self.verdict = Verdict(rank=first.rank, pid=first.pid, host=first.host, time=now,
                               message=f"{summary(stuck)} (no progress for {now - stuck.since:.0f} s: "
                                       f"ended by the hang timeout, {self.settings.timeout():g} s)",
                               traceback=self._stacks.get(first.rank, ""), hint=hint)
        self.end([view.pid for view in targets])

    # --- stacks -------------------------------------------------------------------------------

    def ask_for_stacks(self, request: str) -> None:
        """Ask the ranks' probes for their stacks (each answers within a second)."""
        with contextlib.suppress(OSError):
            (self.folder / STACKS_REQUEST).write_text(request)

    def collect_stacks(self, views: Sequence[RankView]) -> str | None:
        """Ask every rank for its stacks, wait for the answers, and write them to one file (its path)."""
        self._requests += 1
        request = f"{os.getpid()}-{self._requests}"
        self.ask_for_stacks(request)
        answers: dict[int, str] = {}
        deadline = time.monotonic() + self.stacks_wait
        while len(answers) < len(views):
            for view in views:
                if view.rank in answers:
                    continue
                with contextlib.suppress(OSError):
                    head, _, body = stacks_path(self.folder, view.rank).read_text().partition("\n")
                    if head == f"request {request}":
                        answers[view.rank] = body
            if len(answers) == len(views) or self._stop.wait(0.1) or time.monotonic() > deadline:
                break
        self._stacks = {rank: _main_thread(text) for rank, text in answers.items()}
        parts = []
        for view in sorted(views, key=lambda v: v.rank):
            text = answers.get(view.rank)
            if text is None:
                why = ("it is stopped" if view.process == "stopped" else
                       f"it did not answer within {self.stacks_wait:g} s (its interpreter lock is held, "
                       "e.g. by native code that does not release it)")
                text = f"(no stack: {why})\n"
            parts.append(f"=== rank {view.rank} on {view.host} (pid {view.pid}), {view.condition()}\n{text}")
        return self.write_stacks(parts)

    def write_stacks(self, parts: Sequence[str]) -> str | None:
        """The stacks file of this request, under ``stacks_dir``: its path (None: it could not be written)."""
        name = f"ringtrain-stacks-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{self._requests}.txt"
        path = os.path.join(self.stacks_dir, name)
        try:
            with open(path, "w") as fp:
                fp.write("\n".join(parts))
        except OSError:
            return None
        return path

    # --- the thread ---------------------------------------------------------------------------

    def start(self, interval: float = 1.0) -> NodeWatch:
        global _active
        if self.relay is not None:
            _active = self  # the driver's requests for stacks reach it (on_driver_request)

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.look()
                except Exception as exc:  # noqa: BLE001 - a broken watch must not end a healthy job
                    self.say(f"ringtrain run: the watch stopped: {type(exc).__name__}: {exc}")
                    return

        self._thread = threading.Thread(target=loop, name="ringtrain-node-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop looking; the run's straggler summary, if any, is said last."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        line = self.final_summary()
        if line:
            self.say(line)

    def forget_verdict(self) -> Verdict | None:
        """The verdict, taken: the ranks are restarted, and the next attempt is watched afresh."""
        verdict, self.verdict, self._told = self.verdict, None, None
        self.pace = WarnTime()
        return verdict


def arrival_pairs(record: Mapping[str, Any]) -> list[tuple[Hashable, float]]:
    """A record's arrivals: torch's collective numbers and the Horovod engine's ``name#n``."""
    pairs: list[tuple[Hashable, float]] = [
        (int(seq), float(when)) for seq, when in record.get("arrivals") or ()]
    engine = record.get("engine") or {}
    pairs += [(str(name), float(when)) for name, when in engine.get("arrivals") or ()]
    return pairs


def _main_thread(stacks: str) -> str:
    """The main thread's part of a rank's stacks answer."""
    part = stacks.split("\nThread ", 1)[0]
    return part.split("\n", 1)[1] if part.startswith("Thread ") else part


#: The watch of this agent's ranks that relays to a driver: requests on the link reach it.
_active: NodeWatch | None = None


def on_driver_request(line: bytes) -> bool:
    """``stacks ID`` from the driver: this agent's watch answers on a thread of its own (the link's
    reader must not wait for the ranks). Returns whether the line was the watch's."""
    if not line.startswith(STACKS_REQUEST_LINE + b" "):
        return False
    watch = _active
    if watch is not None:
        request = line[len(STACKS_REQUEST_LINE) + 1:].decode(errors="replace").strip()
        threading.Thread(target=watch.answer_stacks, args=(request,), name="ringtrain-stacks",
                         daemon=True).start()
    return True


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
