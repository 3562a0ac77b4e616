"""``horovod.runner.common.util.timeout``: a deadline with a message that names what timed out."""

from __future__ import annotations

import time


class TimeoutException(Exception):
    """An activity did not finish before its deadline."""


class Timeout:
    """A deadline ``timeout`` seconds from now; ``message`` may contain ``{activity}``."""

    def __init__(self, timeout: float, message: str) -> None:
        self._timeout = timeout
        self._deadline = time.monotonic() + timeout
        self._message = message

    def remaining(self) -> float:
        """Seconds left (0 once past the deadline)."""
        return max(0.0, self._deadline - time.monotonic())

    def timed_out(self) -> bool:
        """Whether the deadline has passed."""
        return time.monotonic() >= self._deadline

    def check_time_out_for(self, activity: str) -> None:
        """Raise :class:`TimeoutException` naming ``activity`` once the deadline has passed."""
        if self.timed_out():
            raise TimeoutException(self._message.format(activity=activity))
