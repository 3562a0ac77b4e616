"""Which rank keeps the others waiting: from when each rank arrives at each collective.

Every rank's probe sends, with its record, when it issued each of its newest collectives (torch's
flight recorder keeps that time for every collective of the default group). A collective that every
rank of the node reported has one rank that arrived last, and the others waited for it from their own
arrival until then. A rank that arrives last at most collectives, by more than a few milliseconds, is
the job's straggler: a slow host, a throttled GPU, a noisy neighbour, or more work than the others.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

#: Collectives of the rolling window a live verdict is drawn from, and the fewest it needs.
WINDOW = 200
MIN_COLLECTIVES = 50
#: A straggler arrives last at this share of the window's collectives...
LAST_SHARE = 0.75
#: ...and by at least this much (median over the collectives it was last at), in seconds.
MIN_LATE_S = 0.010
#: Pending collectives (not yet reported by every rank) kept before the oldest are dropped.
PENDING_LIMIT = 4096


@dataclass(frozen=True)
class Straggler:
    """One rank that arrives last at most collectives."""

    rank: int
    share: float
    """Share of the collectives counted at which it arrived last."""
    late_s: float
    """Median of how long after the others' median it arrived, where it was last."""
    collectives: int

    def line(self, host: str) -> str:
        return (f"rank {self.rank} on {host} is the slowest: it arrives last at {self.share * 100:.0f} % of "
                f"{self.collectives} collectives, {self.late_s * 1000:.0f} ms after the others (median)")


class Arrivals:
    """Arrival times per collective, the rolling window of complete ones, and totals for the summary.

    A collective is named by anything the ranks agree on: its number in the default torch group, or
    ``name#n`` for the n-th request of that name to the Horovod engine.
    """

    def __init__(self, window: int = WINDOW) -> None:
        self._pending: dict[Hashable, dict[int, float]] = {}
        self._window: deque[tuple[int, float]] = deque(maxlen=window)
        """(rank that arrived last, how late) of the newest complete collectives."""
        self._done: set[Hashable] = set()
        self._done_order: deque[Hashable] = deque()
        self.last_counts: dict[int, int] = {}
        self.late: dict[int, deque[float]] = {}
        self.complete = 0

    def add(self, rank: int, arrivals: Iterable[tuple[Hashable, float]], ranks: set[int]) -> None:
        """Rank ``rank`` issued collective ``key`` at time ``t`` (seconds) for each pair; ``ranks``: all
        the node's ranks, whose arrivals make a collective complete."""
        for key, when in arrivals:
            if key in self._done:
                continue
            times = self._pending.setdefault(key, {})
            times[rank] = when
            if ranks <= times.keys():
                self._finish(key, {r: times[r] for r in ranks})
        while len(self._pending) > PENDING_LIMIT:  # the oldest first: dicts keep their order
            del self._pending[next(iter(self._pending))]

    def _finish(self, key: Hashable, times: Mapping[int, float]) -> None:
        del self._pending[key]
        self._done.add(key)
        self._done_order.append(key)
        while len(self._done_order) > PENDING_LIMIT:
            self._done.discard(self._done_order.popleft())
        last = max(times, key=lambda r: times[r])
        others = [t for r, t in times.items() if r != last]
        late = times[last] - statistics.median(others)
        self._window.append((last, late))
        self.complete += 1
        self.last_counts[last] = self.last_counts.get(last, 0) + 1
        self.late.setdefault(last, deque(maxlen=1000)).append(late)

    def straggler(self) -> Straggler | None:
        """The rank the window's collectives waited for, if one does persistently (None otherwise)."""
        return _verdict(list(self._window))

    def summary(self) -> Straggler | None:
        """The same over every collective counted since the start."""
        if self.complete < MIN_COLLECTIVES or not self.last_counts:
            return None
        rank = max(self.last_counts, key=lambda r: self.last_counts[r])
        share = self.last_counts[rank] / self.complete
        late = statistics.median(self.late[rank])
        if share < LAST_SHARE or late < MIN_LATE_S:
            return None
        return Straggler(rank, share, late, self.complete)


def _verdict(window: list[tuple[int, float]]) -> Straggler | None:
    if len(window) < MIN_COLLECTIVES:
        return None
    counts: dict[int, list[float]] = {}
    for rank, late in window:
        counts.setdefault(rank, []).append(late)
    rank = max(counts, key=lambda r: len(counts[r]))
    share = len(counts[rank]) / len(window)
    late = statistics.median(counts[rank])
    if share < LAST_SHARE or late < MIN_LATE_S:
        return None
    return Straggler(rank, share, late, len(window))
