"""How a node's agent stops on a signal: within a bound, whatever its ranks or its own threads do.

torch's elastic agent answers SIGINT, SIGTERM, SIGHUP and SIGQUIT by raising ``SignalException`` in
its main thread; on the way out it sends the signal to every rank and SIGKILL to those still alive
:data:`RANK_GRACE_S` later. :class:`StopGuard` wraps those handlers and adds what a user at a
terminal expects:

* the first signal is announced, with how long the ranks get and that a second Ctrl-C ends them now;
* a second signal kills the ranks at once instead of raising again inside the shutdown, which
  interrupted it half-way and could leave it without the SIGKILL that ends stuck ranks. One that
  follows the first within :data:`REPEAT_AFTER_S` is the same stop delivered twice (``timeout`` and
  the terminal both pass Ctrl-C on; a driver closes the agent's stdin and signals it) and is ignored;
* a watchdog: when the agent has not finished stopping :data:`STOP_LIMIT_S` after the first signal,
  whatever holds it (a blocking call, a lock), it writes the stack of every thread to stderr (so the
  cause can be found), kills the ranks, runs :func:`at_forced_exit` callbacks and exits with
  128 + the signal's number. A Ctrl-C never leaves a job hanging.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

#: Seconds torch's agent gives its ranks after the stop signal before it sends SIGKILL.
RANK_GRACE_S = 30.0
#: Seconds after the first stop signal by which the agent must have finished stopping.
STOP_LIMIT_S = RANK_GRACE_S + 15.0
#: Seconds after the first stop signal before another one counts as a second request.
REPEAT_AFTER_S = 1.0
#: The signals torch's agent stops on (its TORCHELASTIC_SIGNALS_TO_HANDLE default).
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: A rank's status after it stopped for a handled signal and wrote its snapshot (the Trainer's
#: PREEMPTED_EXIT, train/preemption.py): a node whose every rank ended so ends with it too, and so does
#: ``ringtrain run``, so that a job script can requeue the job (launch/scripts.py).
PREEMPTED_STATUS = 75
#: Signals that warn of a stop without being one (the schedulers' warnings: Slurm ``--signal``, LSF
#: ``-wa``): the agent passes them to its ranks, which snapshot and stop; left alone, the default action
#: of SIGUSR1 would end the agent itself.
WARNING_SIGNALS = ("SIGUSR1",)


@contextlib.contextmanager
def warnings_passed_on(ranks: Callable[[], Iterable[int]]) -> Iterator[None]:
    """While the block runs, a :data:`WARNING_SIGNALS` signal to this process goes to each of ``ranks()``
    (main thread only; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def pass_on(signum: int, _frame: Any) -> None:
        for pid in ranks():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    saved = {sig: signal.signal(sig, pass_on) for sig in (getattr(signal, n) for n in WARNING_SIGNALS)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

_forced_exit_callbacks: list[Callable[[int], None]] = []


@contextlib.contextmanager
def at_forced_exit(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(signum)`` if the watchdog ends this process while the block runs."""
    _forced_exit_callbacks.append(callback)
    try:
        yield
    finally:
        _forced_exit_callbacks.remove(callback)


def kill_process_groups(pids: Iterable[int]) -> None:
    """SIGKILL each rank with everything it started (torch starts every rank in a session of its own)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def stopping_line(signum: int, grace_s: float = RANK_GRACE_S, where: str = "") -> str:
    """What a launcher says at the first stop signal: how long the ranks get, how to end them now."""
    name = signal.Signals(signum).name
    again = "press Ctrl-C again" if signum == signal.SIGINT else f"send {name} again"
    return f"{name}: stopping the ranks{where} (they get {grace_s:g} s; {again} to kill them now)."


def killing_line(signum: int, where: str = "") -> str:
    """What a launcher says when a second stop signal kills the ranks."""
    return f"{signal.Signals(signum).name} again: killing the ranks{where} now."


class StopGuard:
    """The agent's stop signals, announced, escalated on a second one, and bounded by a watchdog.

    ``ranks`` returns the pids of the ranks running now. ``interactive`` (off for an agent started by
    a driver, which speaks to the user and decides when to kill) says on ``out`` what the first signal
    does and lets a second one kill the ranks.
    """

    def __init__(self, ranks: Callable[[], Iterable[int]], *, interactive: bool = True,
                 limit_s: float = STOP_LIMIT_S, grace_s: float = RANK_GRACE_S,
                 out: TextIO | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.ranks = ranks
        self.interactive = interactive
        self.clock = clock
        self._first_at = 0.0
        self.limit_s, self.grace_s = limit_s, grace_s
        self.out = out
        #: The first stop signal's number (None until one arrives).
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._done = threading.Event()

    def _stream(self) -> TextIO:
        return self.out if self.out is not None else sys.stderr

    def install(self) -> None:
        """Wrap the handlers installed now (torch's, after it starts the ranks); main thread only.

        Called again after each restart, since torch installs its handlers again with every start.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for name in STOP_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            current = signal.getsignal(signum)
            if current == self._on_signal:
                continue
            self._previous[signum] = current
            signal.signal(signum, self._on_signal)

    def finish(self) -> None:
        """The agent has stopped (or ended normally): the watchdog stands down."""
        self._done.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            if self.interactive and self.clock() - self._first_at >= REPEAT_AFTER_S:
                self._say(killing_line(signum))
                kill_process_groups(self.ranks())
            return
        self.signum, self._first_at = signum, self.clock()
        if self.interactive:
            self._say(stopping_line(signum, self.grace_s))
        threading.Thread(target=self._watch, name="ringtrain-stop-watchdog", daemon=True).start()
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    def _watch(self) -> None:
        if self._done.wait(self.limit_s):
            return
        assert self.signum is not None
        out = self._stream()
        name = signal.Signals(self.signum).name
        self._say(f"still stopping {self.limit_s:g} s after {name}; the stack of every thread follows "
                  "(please report it), then the ranks are killed and the launcher exits.")
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=out, all_threads=True)
        kill_process_groups(self.ranks())
        for callback in list(_forced_exit_callbacks):
            with contextlib.suppress(Exception):
                callback(self.signum)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            out.flush()
        os._exit(128 + self.signum)

    def _say(self, text: str) -> None:
        # RuntimeError: the signal interrupted this thread inside a write to the same stream.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            print(f"ringtrain run: {text}", file=self._stream(), flush=True)

