"""Graceful stop on a signal: every rank learns of it, all stop after the same step, one snapshot, one status.

A scheduler warns before it stops a job (Slurm ``--signal=B:USR1@120`` and preemption's SIGTERM, PBS's
SIGTERM at walltime, LSF ``bsub -wa USR1``). A rank that receives one of the handled signals only sets
a flag (:class:`StopSignals`); the ranks agree on it through a small sum started after an optimizer
step and read a few steps later, about every half second (:class:`StopAgreement`), so the sum overlaps
computation, and every rank sees the same answer after the same step. The
Trainer then writes one step-exact snapshot and raises :class:`Preempted`; ``ringtrain train``'s ranks
exit with :data:`PREEMPTED_EXIT` and the launcher says ``preempted at step S, snapshot P``. Running the
same command again resumes from it.

User scripts ask :func:`stop_requested` at the same points on every rank (it is collective).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

#: Exit status of a rank (and of ``ringtrain train``) that stopped for a handled signal after writing
#: its snapshot: sysexits' EX_TEMPFAIL, "try again later" - a requeued job resumes. The launcher's
#: (launch/report.py) so that ``ringtrain run`` knows it too.
from ringtrain.launch.report import PREEMPTED_EXIT

#: The signals the Trainer handles unless told otherwise (torchrun's ``--signals-to-handle`` spelling).
DEFAULT_SIGNALS = "SIGTERM,SIGUSR1"
#: What a rank adds to the agreement's sum when its allocation ends within the margin (not a signal).
WALLTIME_CODE = 1000
#: Name of the file a rank 0 that stopped for a signal leaves in ``ringtrain train``'s error folder.
NOTE_NAME = "preempted.txt"


class Preempted(Exception):  # not an error: the job stopped on request, resumably
    """Every rank stopped after optimizer step ``step`` for ``signal_name``; ``snapshot`` was written then
    (None without a snapshot folder)."""

    def __init__(self, step: int, snapshot: Path | None, signal_name: str) -> None:
        where = f"snapshot {snapshot}" if snapshot else "no snapshot (no snapshot folder)"
        super().__init__(f"preempted at step {step}, {where} ({signal_name})")
        self.step, self.snapshot, self.signal_name = step, snapshot, signal_name


def parse_signals(text: str | Iterable[str]) -> tuple[signal.Signals, ...]:
    """``"SIGTERM,SIGUSR1"`` (or ``"TERM,USR1"``, or names in a list) -> the signals; empty: none.

    Raises ``ValueError`` naming an unknown or unhandleable name and the fix.
    """
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    found = []
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
        sig = getattr(signal.Signals, full, None)
        if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
            # field=value, as TrainerConfig's other messages: ringtrain train tells it as its flag
            given = text if isinstance(text, str) else ",".join(names)
            raise ValueError(f"signals_to_handle={given!r}: {name!r} is not a signal that can be "
                             f"handled. HINT: use names such as {DEFAULT_SIGNALS!r} (comma-separated), or '' "
                             "for none.")
        found.append(sig)
    return tuple(dict.fromkeys(found))


class StopSignals:
    """Handlers that note the first handled signal (and nothing else: the step in flight goes on)."""

    def __init__(self, signals: Iterable[signal.Signals], deadline: float | None = None) -> None:
        self.signals = tuple(signals)
        self.received: signal.Signals | None = None
        #: Seconds since the epoch after which this rank asks to stop as if signalled (the walltime less
        #: the margin); None: no deadline.
        self.deadline = deadline
        self._saved: dict[signal.Signals, Any] = {}

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def install(self) -> StopSignals:
        """Install the handlers (only the main thread can; elsewhere nothing is installed)."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._saved[sig] = signal.signal(sig, self._note)
        return self

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()

    def _note(self, signum: int, _frame: object) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)


#: ``sum_async(tensor)`` starts a sum over ranks and returns what waits for its result.
SumAsync = Callable[[torch.Tensor], Callable[[], torch.Tensor]]


class StopAgreement:
    """The ranks' common answer to "did any rank get a handled signal?", a fraction of a second late.

    ``poll()`` after every optimizer step (on every rank). Every few steps it reads the sum started at
    the previous such poll, starts the next one with this rank's flag, and returns the number of the
    signal any rank got (0: none). The value read is the same on every rank, and so is the step it is
    read at, so all stop after the same step.

    How many steps go between two sums is agreed too: rank 0 adds to each sum the count of steps that
    take about ``every_s`` seconds at the pace it measured, and every rank reads it with the flag, so a
    job pays one small sum per ``every_s`` instead of one a step, and a signal still stops the ranks
    within about two ``every_s`` plus a step. ``every_s`` 0: a sum every step. What the check costs is
    measured by benchmarks/stop_check_bench.py (the figures: docs/preemption.md).
    """

    #: Most steps between two sums, whatever the pace (a step of microseconds).
    MAX_EVERY = 10_000

    def __init__(self, sum_async: SumAsync, signals: StopSignals, rank: int = 0, every_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._sum_async = sum_async
        self.signals = signals
        self.rank = rank
        self.every_s = every_s
        self._clock = clock
        self._pending: Callable[[], torch.Tensor] | None = None
        #: Steps between the sum in flight and its read (agreed: the same on every rank).
        self.every = 1
        self._countdown = 0
        self._started_at: float | None = None
        self._steps_since_start = 0

    def _flag(self) -> float:
        got = self.signals.received
        if got is None and self.signals.past_deadline():
            return float(WALLTIME_CODE)
        return float(got) if got is not None else 0.0

    def _next_every(self) -> float:
        """Rank 0's proposal for the steps until the next read (0 from the other ranks: it is a sum)."""
        if self.rank != 0:
            return 0.0
        now, started, steps = self._clock(), self._started_at, self._steps_since_start
        self._started_at, self._steps_since_start = now, 0
        if started is None or self.every_s <= 0 or now <= started or steps <= 0:
            return 1.0
        per_step = (now - started) / steps
        return float(min(max(round(self.every_s / per_step), 1), self.MAX_EVERY))

    def poll(self) -> int:
        self._steps_since_start += 1
        self._countdown -= 1
        if self._countdown > 0:
            return 0
        agreed = 0
        if self._pending is not None:
            # the sum of signal numbers: not a signal when two ranks got different ones, so report the
            # number only when it is one; any non-zero sum stops every rank alike
            total = self._pending()
            self._pending = None
            agreed = int(total[0].item())
            self.every = max(int(total[1].item()), 1)
        if not agreed:
            self._pending = self._sum_async(torch.tensor([self._flag(), self._next_every()],
                                                         dtype=torch.float64))
            self._countdown = self.every
        return agreed

    def drain(self) -> None:
        """Wait for a sum still in flight (before the process group goes)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending()


def signal_name(agreed: int, local: signal.Signals | None, past_deadline: bool = False) -> str:
    """A readable name for what stopped the ranks."""
    if local is not None:
        return local.name
    if past_deadline or agreed == WALLTIME_CODE:
        return "the allocation's end is near"
    try:
        return signal.Signals(agreed).name
    except ValueError:
        return "signals"


def stop_requested(_state: dict[str, Any] = {}) -> bool:  # noqa: B006 - the module's one set of handlers
    """True on every rank when any rank received SIGTERM or SIGUSR1 (collective: call it at the same
    points on every rank, e.g. every N steps; the first call installs the handlers).

    Works under the Horovod API (``hvd.init()``) and under torch.distributed; with neither, it answers
    for this process alone. Then write a snapshot (or ``state.commit()`` in elastic mode) and exit
    with :data:`PREEMPTED_EXIT`.
    """
    handlers = _state.get("handlers")
    if handlers is None:
        handlers = _state["handlers"] = StopSignals(parse_signals(DEFAULT_SIGNALS)).install()
    flag = torch.tensor([1.0 if handlers.received is not None else 0.0], dtype=torch.float64)
    return bool(_sum_over_ranks(flag).item() > 0)


def _sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    from ringtrain import mpi_ops

    if mpi_ops.is_initialized():
        return mpi_ops.allreduce(tensor, name="ringtrain.stop_requested", op=mpi_ops.Sum)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        work = tensor.clone()
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
        return work
    return tensor


__all__ = ["DEFAULT_SIGNALS", "PREEMPTED_EXIT", "Preempted", "StopAgreement", "StopSignals", "parse_signals",
           "stop_requested"]
