"""Progress on rank 0 only: a bar on a terminal, a line every few seconds anywhere else.

Under ``ringtrain run``, torchrun, Slurm or PBS the ranks' output goes through pipes or files, where a
bar cannot redraw; a plain line now and then still tells the person reading the log that the job moves.
A rank's output is a file under ``ringtrain run`` too, but when the launcher's console is a terminal it
says so (``RINGTRAIN_LIVE_CONSOLE=1``) and draws rank 0's bar there as one live line.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

#: Seconds between two progress lines when stdout is not a terminal.
LINE_INTERVAL_S = 10.0
#: Seconds between two updates of the numbers shown beside a bar (tqdm redraws at most this often too).
POSTFIX_INTERVAL_S = 0.5

#: Set by ``ringtrain run`` when its console is a terminal that draws rank 0's bar live (launch.logs).
LIVE_CONSOLE_VARIABLE = "RINGTRAIN_LIVE_CONSOLE"


def bar_is_drawn() -> bool:
    """Whether a redrawn bar reaches a terminal: stdout is one, or the launcher draws it on one."""
    return sys.stdout.isatty() or os.environ.get(LIVE_CONSOLE_VARIABLE) == "1"


class Progress:
    """Wraps tqdm; every method is a no-op when disabled (other ranks, ``progress=False``)."""

    def __init__(self, enabled: bool, total: int, description: str, initial: int = 0,
                 interval_s: float = LINE_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._bar: Any = None
        self._lines = False
        self._clock = clock
        self._postfix_at = float("-inf")
        if enabled and bar_is_drawn():
            from tqdm.auto import tqdm

            # a terminal of our own can tell its width as it changes; the launcher's sets TQDM_NCOLS
            self._bar = tqdm(total=total, initial=initial, desc=description, leave=False,
                             dynamic_ncols=sys.stdout.isatty(), file=sys.stdout)
        elif enabled:
            self._lines = True
            self._total, self._description = total, description
            self._interval, self._clock = interval_s, clock
            self._done = self._first = initial
            self._start = self._last = clock()

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n`` batches and show the given numbers (floats or one-element tensors).

        Tensors are converted only when a line or bar will show them: on other ranks, and with
        progress off, a step never waits for its loss to reach the host.
        """
        if self._bar is not None:
            self._bar.update(n)
            now = self._clock()
            if postfix and now - self._postfix_at >= POSTFIX_INTERVAL_S:
                self._postfix_at = now
                self._bar.set_postfix({k: f"{float(v):.4f}" for k, v in postfix.items()}, refresh=False)
        elif self._lines:
            self._done += n
            now = self._clock()
            if now - self._last >= self._interval and self._done < self._total:
                self._last = now
                rate = (self._done - self._first) / max(now - self._start, 1e-9)
                line = (f"{self._description}: {self._done}/{self._total} batches "
                        f"({100 * self._done // max(self._total, 1)}%), {rate:.1f} batches/s")
                line += "".join(f", {k} {float(v):.4f}" for k, v in postfix.items())
                sys.stdout.write(line + "\n")  # one write: ranks' lines must not interleave mid-line
                sys.stdout.flush()

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._lines = False
