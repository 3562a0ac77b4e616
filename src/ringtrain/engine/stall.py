"""Stall inspector: rank 0 names the ranks that keep everyone waiting.

Ranks report the names they have had pending for a while (piggy-backed on negotiation rounds); rank 0
combines the reports with the replicated table of uncached requests and logs Horovod's warning.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("ringtrain.engine.stall")


class StallInspector:
    """Tracks how long names wait and warns (rank 0) once they wait longer than the check time."""

    def __init__(self, check_time: float = 60.0, shutdown_time: float = 0.0, disabled: bool = False) -> None:
        """Times in seconds (``HOROVOD_STALL_CHECK_TIME_SECONDS``, ``..._SHUTDOWN_TIME_SECONDS``)."""
        self.disabled = disabled
        self.check_time = check_time
        self.shutdown_time = shutdown_time
        if self.shutdown_time and self.shutdown_time <= self.check_time:
            # Horovod only honours a shutdown time that exceeds the warning time.
            self.shutdown_time = 0.0
        self._last_report = 0.0
        self._told: set[tuple[int, str]] = set()
        """(rank, name) pairs already warned about in this stall."""
        #: rank -> {name: (first time rank 0 heard about it, process set id)}
        self.reports: dict[int, dict[str, tuple[float, int]]] = {}

    def should_report(self, oldest_pending_age: float) -> bool:
        """Whether this rank should send its pending names with the next round."""
        if self.disabled or oldest_pending_age < self.check_time / 2:
            return False
        now = time.monotonic()
        if now - self._last_report < max(0.2, self.check_time / 4):
            return False
        self._last_report = now
        return True

    def record_report(self, rank: int, names: list[tuple[str, int]]) -> None:
        """Rank ``rank`` has had these (name, process set id) pending for a while."""
        now = time.monotonic()
        old = self.reports.get(rank, {})
        self.reports[rank] = {name: (old.get(name, (now, set_id))[0], set_id) for name, set_id in names}

    def _hint(self) -> str:
        if self.shutdown_time:
            return f"This warning is not repeated; the job ends after {self.shutdown_time:g} s of stall."
        return ("This warning is not repeated. Under `ringtrain run` the launcher names the rank the job "
                "waits for and where it is; HINT: `ringtrain run --hang-timeout SECONDS` (or "
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS) ends a job stuck that long (docs/failures.md).")

    def forget(self, name: str) -> None:
        for names in self.reports.values():
            names.pop(name, None)

    def check(self, waiting: dict[str, tuple[float, set[int], list[int]]]) -> bool:
        """Warn about names waiting longer than the check time.

        ``waiting`` maps name -> (first seen, ranks that submitted it, ranks expected). Returns True
        when the stall shutdown time has passed.
        """
        if self.disabled:
            return False
        now = time.monotonic()
        stalled = {name: v for name, v in waiting.items() if now - v[0] >= self.check_time and v[2]}
        if not stalled:
            self._told.clear()  # the stall is over: a new one is warned about again
            return False
        missing: dict[int, list[str]] = {}
        for name, (_, submitted, expected) in sorted(stalled.items()):
            for rank in expected:
                if rank not in submitted:
                    missing.setdefault(rank, []).append(name)
        told = {(rank, name) for rank, names in missing.items() for name in names}
        # Once per stall: Horovod repeats its warning every check time for as long as the job hangs,
        # which says nothing new and never says how to end the job.
        if missing and not told <= self._told:
            self._told |= told
            lines = "\n".join(f"{rank}: [{', '.join(names)}]" for rank, names in sorted(missing.items()))
            log.warning(
                "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
                "ranks and are waiting for remainder of ranks for more than %d seconds. This may "
                "indicate that different ranks are trying to submit different tensors or that only "
                "subset of ranks is submitting tensors, which will cause deadlock.\nMissing ranks:\n%s\n"
                "%s",
                int(self.check_time),
                lines,
                self._hint(),
            )
        oldest = min(v[0] for v in stalled.values())
        return bool(self.shutdown_time) and now - oldest >= self.shutdown_time
