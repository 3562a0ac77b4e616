"""Whether a job is stuck, on which ranks, and how to say it: pure decisions over the ranks' records.

A collective completes only once every rank of its group has called it, so the rank that issued the
fewest collectives of the default group is the one the others wait for; ranks that issued more wait
in the newest one. The Horovod engine's requests say the same in names: the ranks with a request
pending wait for the ranks that have not sent it. A rank that keeps a core busy while the others wait
(rank 0 evaluating while the rest wait in a barrier) is described as busy, not as hung.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Warning time bounds (s) and how many of the job's longest pause between progress it waits.
WARN_MIN_S = 30.0
WARN_MAX_S = 100.0
WARN_PAUSES = 10.0
#: Hang timeout (s) without --hang-timeout: torch's NCCL default. It ends a job by default only when
#: the ranks waited for are not busy; an explicit --hang-timeout ends it either way.
DEFAULT_HANG_TIMEOUT_S = 600.0
#: Share of one core above which a rank is busy, not blocked.
BUSY_CPU = 0.2


@dataclass(frozen=True)
class RankView:
    """One rank as the node's agent sees it: its newest record and its process."""

    rank: int
    pid: int
    host: str
    progress_time: float
    sequence: int | None = None
    """Collectives the rank's default torch process group has issued (None: no torch group)."""
    collective: dict[str, Any] | None = None
    """The newest collective's ``op`` and ``sizes`` (torch's flight recorder), when known."""
    engine_pending: tuple[str, ...] | None = None
    """Names the Horovod engine has pending (None: no engine)."""
    where: tuple[str, int, str] | None = None
    """The innermost frame of the user's code (file, line, function)."""
    in_library: bool = False
    """Whether the main thread is inside torch or ringtrain (a collective, backward) right now."""
    process: str = "running"
    """``running``, ``sleeping``, ``stopped``, ``disk`` (uninterruptible: I/O or swap), ``gone``."""
    cpu: float | None = None
    """Share of one core the process used over the last seconds (None: not known)."""

    @classmethod
    def from_record(cls, record: dict[str, Any], host: str, process: str = "running",
                    cpu: float | None = None) -> RankView:
        from ringtrain.watch.probe import is_library

        engine = record.get("engine")
        inner = record.get("innermost") or None
        where = record.get("where")
        return cls(rank=int(record["rank"]), pid=int(record["pid"]), host=host,
                   progress_time=float(record["progress_time"]), sequence=record.get("sequence"),
                   collective=record.get("collective"),
                   engine_pending=tuple(engine.get("pending", ())) if engine else None,
                   where=(str(where[0]), int(where[1] or 0), str(where[2])) if where else None,
                   in_library=inner is not None and is_library(inner[0]), process=process, cpu=cpu)

    def condition(self) -> str:
        """``stopped (SIGSTOP)``, ``busy (95 % of a core)``, ``blocked (no CPU use)``..."""
        if self.process == "stopped":
            return "stopped (SIGSTOP or a debugger: `kill -CONT` resumes it)"
        if self.process == "disk":
            return "in uninterruptible sleep (waiting on disk, a network file system or swap)"
        if self.process == "gone":
            return "gone (the process ended)"
        if self.cpu is not None and self.cpu >= BUSY_CPU:
            return f"busy ({self.cpu * 100:.0f} % of a core)"
        if self.cpu is not None:
            return "blocked (no CPU use)"
        return "making no progress"

    def busy(self) -> bool:
        return self.process == "running" and self.cpu is not None and self.cpu >= BUSY_CPU

    def place(self) -> str:
        """``at train.py:42 in step``: where in the user's code the main thread is."""
        # a stopped process's probe stopped with it: its record is from before
        seen = "last seen " if self.process == "stopped" else ""
        if self.where is None:
            return f"{seen}outside the script's own code"
        path, line, function = self.where
        return f"{seen}at {path}:{line} in {function}"


@dataclass(frozen=True)
class Stuck:
    """A diagnosis: who is waited for, who waits where, and for how long nothing moved."""

    kind: str
    """``behind`` (ranks waited for), ``mismatch`` (ranks in different collectives), ``all waiting``."""
    since: float
    culprits: tuple[RankView, ...]
    waiting: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(where they wait, ranks), one entry per place."""
    detail: tuple[str, ...] = field(default=())

    def busy(self) -> bool:
        """Whether every rank waited for is working (not hung)."""
        return bool(self.culprits) and all(view.busy() for view in self.culprits)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0, 2-7``: ranks in ascending runs."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = prev = None
    for rank in [*ordered, None]:
        if start is not None and (rank is None or rank != prev + 1):  # type: ignore[operator]
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if rank is not None and start is None:
            start = rank
        prev = rank
    return ", ".join(parts)


def _ranks_word(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


_SINGULAR = {"wait": "waits", "are": "is"}


def _ranks_do(ranks: Sequence[int], phrase: str) -> str:
    """``rank 0 waits in ...`` / ``ranks 0-3 wait in ...`` for a phrase written for several ranks."""
    verb, _, rest = phrase.partition(" ")
    if len(ranks) == 1:
        verb = _SINGULAR.get(verb, verb)
    return f"{_ranks_word(ranks)} {verb} {rest}"


def describe_collective(sequence: int, collective: dict[str, Any] | None) -> str:
    """``all_reduce #1202 ([[1000]])``, or ``collective #1202`` when its name is not known."""
    if not collective or not collective.get("op"):
        return f"collective #{sequence}"
    sizes = collective.get("sizes")
    return f"{collective['op']} #{sequence}" + (f" (sizes {sizes})" if sizes else "")


def _by_torch_group(views: Sequence[RankView], since: float) -> Stuck | None:
    counted = [v for v in views if v.sequence is not None]
    if len(counted) < 2:
        return None
    newest = max(v.sequence or 0 for v in counted)
    behind = tuple(v for v in counted if v.sequence != newest)
    ahead = [v for v in counted if v.sequence == newest]
    if behind:
        known = next((v.collective for v in ahead if v.collective), None)
        place = f"wait in {describe_collective(newest, known)}"
        return Stuck("behind", since, behind, waiting=((place, tuple(v.rank for v in ahead)),))
    # the same count everywhere: different collectives under one number, or all inside one
    signatures = {(v.collective.get("op"), repr(v.collective.get("sizes"))) for v in counted if v.collective}
    if len(signatures) > 1:
        places: dict[str, list[int]] = {}
        for v in counted:
            places.setdefault(f"are in {describe_collective(newest, v.collective)}", []).append(v.rank)
        return Stuck("mismatch", since, (), waiting=tuple((k, tuple(r)) for k, r in places.items()),
                     detail=("the ranks called different collectives as their collective "
                             f"#{newest}: every rank must call the same collectives in the same order",))
    if all(v.in_library for v in counted):
        known = next((v.collective for v in counted if v.collective), None)
        place = f"are in {describe_collective(newest, known)}"
        return Stuck("all waiting", since, (), waiting=((place, tuple(v.rank for v in counted)),),
                     detail=("every rank called it and none finished it: the transport between them "
                             "is stuck (a host's network, NCCL, a firewall)",))
    return None


def _by_engine(views: Sequence[RankView], since: float) -> Stuck | None:
    served = [v for v in views if v.engine_pending is not None]
    waiting = [v for v in served if v.engine_pending]
    if not waiting:
        return None
    names = {name for v in waiting for name in v.engine_pending or ()}
    behind = tuple(v for v in served if not names <= set(v.engine_pending or ()))
    if not behind:
        return None
    shown = sorted(names)[:3]
    more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    return Stuck("behind", since, behind,
                 waiting=((f"wait in the Horovod engine for {', '.join(shown)}{more}",
                           tuple(v.rank for v in waiting if v not in behind)),))


def diagnose(views: Sequence[RankView], now: float, warn_after: float) -> Stuck | None:
    """The job is stuck when no rank made progress for ``warn_after`` seconds and some rank waits for
    another (or all wait inside one collective); None otherwise."""
    if not views:
        return None
    since = max(v.progress_time for v in views)
    if now - since < warn_after:
        return None
    return _by_torch_group(views, since) or _by_engine(views, since)


@dataclass
class WarnTime:
    """The warning time derived from the job's own pace: ``WARN_PAUSES`` times the longest pause
    between two moments of progress seen so far, within ``WARN_MIN_S``..``WARN_MAX_S``."""

    longest: float = 0.0
    _last: float | None = None

    def saw_progress(self, when: float) -> None:
        if self._last is not None and when > self._last:
            self.longest = max(self.longest, when - self._last)
        self._last = when if self._last is None else max(self._last, when)

    def seconds(self, hang_timeout: float | None = None) -> float:
        derived = min(max(WARN_PAUSES * self.longest, WARN_MIN_S), WARN_MAX_S)
        return min(derived, hang_timeout) if hang_timeout else derived


def format_stuck(stuck: Stuck, now: float, stacks_file: str | None = None,
                 ends: str | None = None) -> str:
    """The report printed once when the job is stuck; ``ends``: when and why the watch ends the job."""
    quiet = now - stuck.since
    at = time.strftime("%H:%M:%S", time.localtime(stuck.since))
    if stuck.culprits:
        who = _ranks_word([v.rank for v in stuck.culprits])
        head = f"no progress for {quiet:.0f} s (since {at}); the job waits for {who}:"
    else:
        head = f"no progress for {quiet:.0f} s (since {at}):"
    lines = [f"ringtrain run: {head}"]
    for view in stuck.culprits:
        lines.append(f"  rank {view.rank} on {view.host} (pid {view.pid}) is {view.condition()}, "
                     f"{view.place()}")
    for place, ranks in stuck.waiting:
        if ranks:
            lines.append(f"  {_ranks_do(ranks, place)}")
    lines.extend(f"  {text}" for text in stuck.detail)
    if stacks_file:
        lines.append(f"  every rank's stacks: {stacks_file}")
    if ends:
        lines.append(f"  {ends}")
    return "\n".join(lines)


def summary(stuck: Stuck) -> str:
    """One line for a failure report's error field."""
    if stuck.culprits:
        views = stuck.culprits
        waits = "; ".join(_ranks_do(r, p) for p, r in stuck.waiting if r)
        who = ", ".join(f"rank {v.rank} {v.condition()} {v.place()}" for v in views)
        return f"stuck: {who}" + (f"; {waits}" if waits else "")
    return "stuck: " + "; ".join([*(_ranks_do(r, p) for p, r in stuck.waiting if r), *stuck.detail])
