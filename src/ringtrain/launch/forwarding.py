"""Signals a launcher passes on to every rank as themselves, without stopping anything itself.

A scheduler warns a job before it ends it (Slurm ``--signal=USR1@120``, LSF ``bsub -wa USR1``); the
warning reaches the launcher, and the ranks are the ones that can act on it (the Trainer snapshots and
stops with status 75). The stop signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT) are not here: the launcher
stops on those and passes them on as a stop, with the ranks' grace (:mod:`ringtrain.launch.stopping`).

Every layer passes :data:`FORWARDED_SIGNALS` one step down: ``ringtrain run`` on one node to its ranks,
a multi-host driver to every host's agent (a request on the link, :mod:`ringtrain.launch.link`), the
launcher inside a Slurm job to its ``srun`` step (which passes them to its tasks, the node agents).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

#: The signals passed on to the ranks as themselves.
FORWARDED_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGUSR1, signal.SIGUSR2)


def signal_pids(pids: Iterable[int], signum: int) -> None:
    """Send ``signum`` to each pid that is still there."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


@contextlib.contextmanager
def forwarding(send: Callable[[int], Any],
               signals: Iterable[signal.Signals] = FORWARDED_SIGNALS) -> Iterator[None]:
    """While the block runs, each of ``signals`` reaching this process calls ``send(signum)`` instead of
    its default action (for SIGUSR1, ending the launcher and so the job). Main thread only; elsewhere
    nothing is installed. The handlers in place before are put back at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, lambda signum, _frame: send(signum)) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


__all__ = ["FORWARDED_SIGNALS", "forwarding", "signal_pids"]
