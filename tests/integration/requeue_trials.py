"""Requeue trials: a 2-node Slurm job from ``ringtrain script slurm --requeue``, warned mid-run.

One trial writes the job script (``ringtrain train mnist``, one rank on each of hostA and hostB, a
snapshot folder in the trial's folder), submits it with ``sbatch``, waits for its first snapshot file
(an event on the shared file system, never a fixed sleep), sends the warning as Slurm sends it at
``--signal=B:USR1@N`` (``scancel --signal=USR1 --batch``: to the batch shell alone), and then follows
the job: the ranks snapshot and stop with status 75, the script requeues the job, the requeued job
resumes from that snapshot and completes. It checks the output file: "preempted at step S", then
"resumed from ... step S", and a final snapshot at the step count of an uninterrupted run.

Slurm holds a requeued job back for a while before it may start again (about two minutes on the test
cluster: ``Reason=BeginTime``). The trial shortens that hold to two seconds once the job shows up
requeued (``scontrol update JobId=... StartTime=now+2``, then ``StartTime=now`` once that has passed, so
that the scheduler starts it at once), as an administrator may: the hold is the site's pacing, not part
of what is checked. Not to zero: a job started again within the second of its requeue is refused by
the nodes ("Killing non-startable batch JobId=...: Job credential revoked", seen in a trial), since
Slurm compares the new credential's time with the revocation's in whole seconds.

``python -m tests.integration.requeue_trials`` is not the entry point: ``benchmarks/requeue_trials.py``
starts the cluster and runs N trials; ``tests/integration/test_requeue.py`` runs one. The ``run`` kind
(``benchmarks/requeue_trials.py --kind run``) submits a batch script of its own that runs ``ringtrain run
--requeue`` instead, warned with ``scancel --signal=USR1`` (every process of the job's steps).
"""

from __future__ import annotations

import datetime
import re
import shlex
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.integration.slurm import SlurmCluster
from tests.integration.system import ringtrain_argv, script_interpreter_flags, tail, wait_for

#: Optimizer steps of the whole run (one epoch cut at this many steps), and a snapshot every few of them.
STEPS = 20
SAVE_EVERY = 5
#: Seconds one trial may take at most (submission to completion), on a loaded 2-core machine.
TRIAL_LIMIT_S = 900.0

_PREEMPTED = re.compile(r"preempted at step (\d+), snapshot (\S+?) \((\w+)\)")
_RESUMED = re.compile(r"resumed from (\S+) \(epoch \d+, batch \d+, step (\d+)\)")
_SNAPSHOT = re.compile(r"snapshot-(\d+)\.pt$")


@dataclass
class Trial:
    """What one trial saw."""

    job_id: str
    preempted_step: int | None = None
    resumed_step: int | None = None
    final_step: int | None = None
    restarts: int | None = None
    state: str = ""
    submit_to_warning_s: float = 0.0
    warning_to_requeued_s: float = 0.0
    requeued_to_completed_s: float = 0.0
    total_s: float = 0.0
    problem: str = ""

    @property
    def passed(self) -> bool:
        return not self.problem

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


#: The kinds of trial: the script of ``ringtrain script slurm --requeue``, or a batch script of one's own
#: that runs ``ringtrain run --requeue`` (warned with ``scancel --signal=USR1``: every process of the
#: job's steps, as Slurm's ``--signal=USR1@N`` without ``B:``).
KINDS = ("script", "run")


def write_job(cluster: SlurmCluster, folder: Path, kind: str = "script") -> Path:
    """The trial's job script: ``ringtrain script slurm --requeue``'s, or (``run``) a hand-written one."""
    command = ["python3", "-m", "ringtrain", "train", "mnist", "--epochs", "1", "--max-steps-per-epoch",
               str(STEPS), "--snapshot-dir", str(folder / "snapshots"), "--save-every-steps", str(SAVE_EVERY),
               "--threads", "1", "--no-progress"]
    job = folder / "job.sh"
    if kind == "run":
        flags = script_interpreter_flags()
        activate = f". {shlex.quote(flags[1])}/bin/activate" if flags[0] == "--venv" else ""
        python = flags[1] if flags[0] == "--python" else "python3"
        job.write_text("\n".join([
            "#!/bin/bash", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=00:30:00",
            "#SBATCH --requeue", "#SBATCH --signal=USR1@120", "#SBATCH --open-mode=append",
            f"#SBATCH --output={folder / 'job.out'}", activate, "export OMP_NUM_THREADS=1",
            shlex.join([python, "-m", "ringtrain", "run", "--requeue", "--nproc-per-node", "1", *command]),
            ""]))
        return job
    generated = cluster.run(ringtrain_argv("script", "slurm", "-N", "2", "--nproc-per-node", "1", "--requeue",
                                           "--time", "00:30:00", "--output", str(folder / "job.out"),
                                           *script_interpreter_flags(), "--", *command), timeout=120)
    if generated.returncode != 0:
        raise RuntimeError(f"ringtrain script failed: {generated.stderr}")
    job.write_text(generated.stdout)
    return job


def _job_fields(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    shown = cluster.run(["scontrol", "show", "job", "-o", job_id], timeout=60).stdout
    return dict(word.split("=", 1) for word in shown.split() if "=" in word)


#: Seconds the trial leaves of Slurm's hold of a requeued job (module doc): more than the one second
#: within which a new launch finds the job's credential still revoked on the nodes.
HOLD_S = 2


def _shorten_hold(cluster: SlurmCluster, job_id: str) -> None:
    """Shorten Slurm's hold of the requeued job to :data:`HOLD_S`, then start it once that has passed."""
    cluster.run(["scontrol", "update", f"JobId={job_id}", f"StartTime=now+{HOLD_S}"], timeout=60)
    fields = _job_fields(cluster, job_id)
    begin = fields.get("EligibleTime", "") or fields.get("StartTime", "")
    try:
        eligible = datetime.datetime.fromisoformat(begin).timestamp()
    except ValueError:
        return  # no begin time shown: the scheduler starts it on its next pass
    # the event: the job's begin time has passed; then an update makes the scheduler look at it at once
    # instead of on its next periodic pass (up to a minute on the test cluster)
    wait_for(lambda: time.time() > eligible + 0.5, 60, "the job's begin time", interval=0.2)
    cluster.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=60)


def run_trial(cluster: SlurmCluster, folder: Path, kind: str = "script") -> Trial:
    """Submit, warn once the first snapshot is written, follow the requeue to the end; see the module doc."""
    folder.mkdir(parents=True, exist_ok=True)
    job = write_job(cluster, folder, kind)
    out = folder / "job.out"
    started = time.monotonic()
    submitted = cluster.run(["sbatch", "--parsable", str(job)], timeout=120, cwd=folder)
    if submitted.returncode != 0:
        raise RuntimeError(f"sbatch failed: {submitted.stderr}")
    trial = Trial(job_id=submitted.stdout.strip().split(";")[0])
    snapshots = folder / "snapshots"

    def ended() -> bool:
        state = _job_fields(cluster, trial.job_id).get("JobState", "")
        trial.state = state
        return state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

    def first_snapshot() -> bool:
        if any(snapshots.glob("snapshot-*.pt")):
            return True
        if ended():
            raise RuntimeError(f"job {trial.job_id} ended ({trial.state}) before its first snapshot:\n"
                               f"{tail(out, 60)}")
        return False

    logs = [out]
    try:
        wait_for(first_snapshot, TRIAL_LIMIT_S, "the job's first snapshot", interval=0.2, logs=logs)
        warned = time.monotonic()
        trial.submit_to_warning_s = warned - started
        # the script's job: the batch shell alone (B:); a job of one's own: every process of its steps
        warn = ["scancel", "--signal=USR1", *(["--batch"] if kind == "script" else []), trial.job_id]
        signalled = cluster.run(warn, timeout=60)
        if signalled.returncode != 0:
            raise RuntimeError(f"{' '.join(warn)} failed: {signalled.stderr}")

        def requeued() -> bool:
            fields = _job_fields(cluster, trial.job_id)
            trial.state = fields.get("JobState", "")
            if trial.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
                raise RuntimeError(f"job {trial.job_id} ended ({trial.state}) instead of being requeued:\n"
                                   f"{tail(out, 60)}")
            return int(fields.get("Restarts", "0")) >= 1 and trial.state == "PENDING"

        wait_for(requeued, TRIAL_LIMIT_S, "the job to be requeued", interval=0.5, logs=logs)
        back = time.monotonic()
        trial.warning_to_requeued_s = back - warned
        _shorten_hold(cluster, trial.job_id)
        wait_for(ended, TRIAL_LIMIT_S, "the requeued job to end", interval=0.5, logs=logs)
        trial.requeued_to_completed_s = time.monotonic() - back
    except RuntimeError as exc:
        trial.problem = str(exc)
        cluster.run(["scancel", trial.job_id], timeout=60)
    trial.total_s = time.monotonic() - started
    _check(trial, cluster, out, snapshots)
    return trial


def _check(trial: Trial, cluster: SlurmCluster, out: Path, snapshots: Path) -> None:
    """Read what the job wrote; the first thing that is not as it must be becomes ``trial.problem``."""
    log = out.read_text(errors="replace") if out.exists() else ""
    fields = _job_fields(cluster, trial.job_id)
    trial.restarts = int(fields.get("Restarts", "0"))
    preempted = sorted({int(m.group(1)) for m in _PREEMPTED.finditer(log)})
    resumed = [int(m.group(2)) for m in _RESUMED.finditer(log)]
    steps = [int(m.group(1)) for p in snapshots.glob("snapshot-*.pt") if (m := _SNAPSHOT.search(p.name))]
    trial.preempted_step = preempted[0] if len(preempted) == 1 else None
    trial.resumed_step = resumed[0] if resumed else None
    trial.final_step = max(steps) if steps else None
    if trial.problem:
        return
    problems = [
        (trial.state == "COMPLETED", f"the job ended {trial.state}, not COMPLETED"),
        (trial.restarts == 1, f"the job ran {trial.restarts} restart(s), not 1"),
        (len(preempted) == 1, f"the ranks reported preemption at steps {preempted} (one step expected)"),
        (len(resumed) == 1 and resumed[0] == trial.preempted_step,
         f"resumed at {resumed}, not once from the preempted step {trial.preempted_step}"),
        ("requeueing job" in log or "requeued the job" in log, "nothing said that the job was requeued"),
        (trial.final_step == STEPS, f"the last snapshot is at step {trial.final_step}, not {STEPS} as an "
                                    "uninterrupted run's"),
        (log.find("preempted at step") < log.rfind("resumed from"), "the resume came before the preemption"),
    ]
    for ok, why in problems:
        if not ok:
            trial.problem = f"{why}\n--- job output:\n{log[-4000:]}"
            return
