"""Put the batch job this launcher runs in back in its scheduler's queue, after a preemption exit.

``ringtrain run --requeue`` and the scripts of ``ringtrain script ... --requeue`` do the same: when the
ranks ended with the preemption status (every rank stopped after the same step and the snapshot is
written), the job requeues itself (``scontrol requeue``, ``qrerun``, ``brequeue``) and the launcher ends
0, since the stop is not a failure; the requeued job runs the same command, which resumes from the
snapshot. Where the requeue is refused (some PBS sites let only operators run ``qrerun``), or there is no
batch job, the status stays 75 and the message says to submit the job again.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping

from ringtrain.launch.report import PREEMPTED_EXIT

#: Per scheduler: the command that requeues a job, and the variable holding the job's id there.
REQUEUE_COMMANDS = {"slurm": ("scontrol requeue", "SLURM_JOB_ID"), "pbs": ("qrerun", "PBS_JOBID"),
                    "lsf": ("brequeue", "LSB_JOBID")}

Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def requeue_command(environ: Mapping[str, str]) -> list[str] | None:
    """The command that requeues the batch job of ``environ`` (None: not inside one)."""
    for command, variable in REQUEUE_COMMANDS.values():
        job = environ.get(variable, "").strip()
        if job:
            return [*command.split(), job]
    return None


def requeue_job(environ: Mapping[str, str], run: Runner = _run) -> int:
    """Requeue the job after a preemption exit: 0 when the scheduler took it back, else
    :data:`PREEMPTED_EXIT`, with a line on stderr either way."""
    command = requeue_command(environ)
    if command is None:
        _say(f"--requeue: preempted (status {PREEMPTED_EXIT}), but this is no Slurm, PBS or LSF batch job "
             "(no SLURM_JOB_ID, PBS_JOBID or LSB_JOBID): nothing to requeue. Run the same command again to "
             "resume from the snapshot.")
        return PREEMPTED_EXIT
    shown = " ".join(command)
    try:
        result = run(command)
        failed = result.returncode != 0
        why = (result.stderr or result.stdout).strip().splitlines()[-1:] if failed else []
    except (OSError, subprocess.SubprocessError) as exc:
        failed, why = True, [f"{type(exc).__name__}: {exc}"]
    if failed:
        _say(f"--requeue: preempted (status {PREEMPTED_EXIT}), but `{shown}` failed"
             f"{': ' + why[0] if why else ''}. HINT: submit the job again to resume from the snapshot.")
        return PREEMPTED_EXIT
    _say(f"preempted (status {PREEMPTED_EXIT}, every rank stopped after the same step and the snapshot is "
         f"written): requeued the job (`{shown}`); it resumes from the snapshot.")
    return 0


def _say(text: str) -> None:
    print(f"ringtrain run: {text}", file=sys.stderr, flush=True)


__all__ = ["REQUEUE_COMMANDS", "requeue_command", "requeue_job"]
