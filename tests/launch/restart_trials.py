"""Restart trials: a 2-rank job with ``--max-restarts 3``, one rank SIGKILLed at a random moment.

One trial starts the job, waits until its snapshots have reached a random point of the run (by
watching the snapshot files appear, never by sleeping a fixed time), waits a further random fraction
of a second so the kill lands anywhere between two snapshots, SIGKILLs one rank chosen at random,
and then checks what the job did: exit 0, exactly one restart announced, training resumed from a
snapshot at least as new as the newest one on disk at the kill (no more progress lost than since
the last snapshot), and the right final epoch and step count. Kinds:

* ``run-train``: ``ringtrain run -np 2 --max-restarts 3 ringtrain train mnist ...`` (the Trainer)
* ``train``: ``ringtrain train mnist -np 2 --max-restarts 3 ...``
* ``ddp``: ``ringtrain run -np 2 --max-restarts 3 python examples/multigpu.py`` (plain torch DDP, a
  snapshot per epoch, the DDP tutorial's script)
* ``hvd``: ``ringtrain run -np 2 --max-restarts 3 python tests/launch/scripts/hvd_checkpoint.py``
  (``import horovod.torch as hvd``, a checkpoint every 20 steps)

Run ``python -m tests.launch.restart_trials --trials 10`` for the acceptance count of issue 10
(every kind, 10 trials each); ``tests/launch/test_restarts.py`` runs one of each in the full suite
(``RINGTRAIN_RESTART_TRIALS`` of each where that variable is set).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
HVD_SCRIPT = ROOT / "tests" / "launch" / "scripts" / "hvd_checkpoint.py"
MULTIGPU = ROOT / "examples" / "multigpu.py"
RUN = [sys.executable, "-m", "ringtrain", "run", "-np", "2", "--max-restarts", "3"]
#: Items of every kind: the smallest set with several snapshots in each epoch (what a trial needs: kill
#: points between snapshots in the middle of epochs and at their ends); each more costs every trial CPU.
SUBSET = 512
TRAIN_FLAGS = ["--subset", str(SUBSET), "--epochs", "4", "--batch-size", "32", "--no-progress", "--threads",
               "1", "--save-every-steps", "4"]
#: Train kinds: 512 items / 2 ranks / 32 per batch = 8 steps per epoch (two snapshots), 4 epochs.
TRAIN_STEPS = 32
DDP_EPOCHS = 5
HVD_STEPS, HVD_EVERY = 120, 20
KINDS = ("run-train", "train", "ddp", "hvd")
_NUMBER = re.compile(r"(\d+)\.pt$")


@dataclass
class Trial:
    """What one trial did and what was wrong with it (``problems`` empty: it passed)."""

    kind: str
    code: int | None = None
    killed_rank: int | None = None
    newest_at_kill: int = 0
    """Progress (step or epoch) of the newest snapshot on disk just before the kill."""
    resumed_at: int | None = None
    problems: list[str] = field(default_factory=list)
    log: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def _command(kind: str, folder: Path) -> tuple[list[str], Path]:
    """The job's command line and the folder its snapshots appear in."""
    snaps = folder / "snapshots"
    results = folder / "results.json"
    if kind == "run-train":
        return [*RUN, "ringtrain", "train", "mnist", *TRAIN_FLAGS, "--snapshot-dir", str(snaps),
                "--results-json", str(results)], snaps
    if kind == "train":
        return [sys.executable, "-m", "ringtrain", "train", "mnist", "-np", "2", "--max-restarts", "3",
                *TRAIN_FLAGS, "--snapshot-dir", str(snaps), "--results-json", str(results)], snaps
    if kind == "ddp":
        return [*RUN, sys.executable, str(MULTIGPU), str(DDP_EPOCHS), "1", "--subset", str(SUBSET),
                "--snapshot-dir", str(snaps)], snaps
    if kind == "hvd":
        snaps.mkdir(parents=True)
        return [*RUN, sys.executable, str(HVD_SCRIPT), str(snaps), "--steps", str(HVD_STEPS), "--every",
                str(HVD_EVERY), "--step-seconds", "0.02"], snaps
    raise ValueError(f"kind {kind!r} is not one of {KINDS}")


def _progress(folder: Path) -> int:
    """The progress number of the newest complete snapshot in ``folder`` (0: none yet)."""
    numbers = [int(m.group(1)) for p in folder.glob("*.pt") if not p.name.startswith(".")
               and (m := _NUMBER.search(p.name))]
    return max(numbers, default=0)


def _targets(kind: str) -> list[int]:
    """The snapshot progress values after which a kill may come (after the first, well before the end)."""
    if kind in ("run-train", "train"):
        return list(range(4, TRAIN_STEPS // 2 + 1, 4))
    if kind == "ddp":
        return [1, 2, 3]
    return list(range(HVD_EVERY, HVD_STEPS // 2 + 1, HVD_EVERY))


def rank_pids(launcher: int) -> dict[int, int]:
    """Rank -> pid of the launcher's worker processes (its children that carry a RANK variable)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != launcher or fields[0] == "Z":
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry)
    return found


def run_trial(kind: str, folder: Path, rng: random.Random, timeout: float = 600.0) -> Trial:
    """One trial of ``kind`` in the empty folder ``folder`` (see the module doc)."""
    trial = Trial(kind)
    command, snaps = _command(kind, folder)
    log_path = folder / "job.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        target = rng.choice(_targets(kind))
        while _progress(snaps) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None or time.monotonic() >= deadline:
            trial.problems.append(f"the job ended or stalled before its snapshots reached {target}")
        else:
            time.sleep(rng.uniform(0.0, 0.5))  # anywhere between this snapshot and the next ones
            ranks = rank_pids(proc.pid)
            if sorted(ranks) != [0, 1]:
                trial.problems.append(f"expected ranks 0 and 1 under the launcher, found {sorted(ranks)}")
            else:
                trial.killed_rank = rng.choice([0, 1])
                trial.newest_at_kill = _progress(snaps)
                try:
                    os.kill(ranks[trial.killed_rank], signal.SIGKILL)
                except ProcessLookupError:
                    trial.problems.append(f"rank {trial.killed_rank} was gone before the kill")
        trial.code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        trial.problems.append(f"the job did not finish within {timeout:g} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    trial.log = log_path.read_text(errors="replace")
    if trial.ok:
        _check(trial, folder)
    return trial


def _check(trial: Trial, folder: Path) -> None:
    out, problems = trial.log, trial.problems
    if trial.code != 0:
        problems.append(f"exit code {trial.code}")
    restarts = out.count("restarting every rank")
    if restarts != 1:
        problems.append(f"{restarts} restart(s) announced, expected 1")
    if f"rank {trial.killed_rank} on " not in out or "killed by SIGKILL" not in out:
        problems.append(f"the restart does not name rank {trial.killed_rank} killed by SIGKILL")
    resumed = {"run-train": r"resumed from \S+ \(epoch \d+, batch \d+, step (\d+)\)",
               "train": r"resumed from \S+ \(epoch \d+, batch \d+, step (\d+)\)",
               "ddp": r"Resuming training from snapshot at Epoch (\d+)",
               "hvd": r"resumed at step (\d+) \(attempt 1\)"}[trial.kind]
    found = [int(n) for n in re.findall(resumed, out)]
    if len(found) != 1:
        problems.append(f"expected one resume line, found {found}")
        return
    trial.resumed_at = found[0]
    if trial.resumed_at < trial.newest_at_kill:
        problems.append(f"resumed at {trial.resumed_at}, older than the snapshot at {trial.newest_at_kill} "
                        "that was on disk at the kill: progress was lost")
    _check_final(trial, folder)


def _check_final(trial: Trial, folder: Path) -> None:
    problems = trial.problems
    if trial.kind in ("run-train", "train"):
        body = json.loads((folder / "results.json").read_text())
        last = body["epochs"][-1]
        if (last["epoch"], last["steps"]) != (4, TRAIN_STEPS):
            problems.append(f"final epoch/steps {last['epoch']}/{last['steps']}, expected 4/{TRAIN_STEPS}")
        if body.get("resumed_from") is None:
            problems.append("results.json does not say which snapshot the last attempt resumed from")
    elif trial.kind == "ddp":
        resumed_part = trial.log.split("Resuming training from snapshot", 1)[1]
        after = [int(e) for e in re.findall(r"Epoch (\d+) \| Batchsize", resumed_part)]
        if after != list(range(trial.resumed_at, DDP_EPOCHS)):
            problems.append(f"epochs after the resume were {after}, expected "
                            f"{list(range(trial.resumed_at, DDP_EPOCHS))}")
        last = torch.load(folder / "snapshots" / f"snapshot-{DDP_EPOCHS:09d}.pt", weights_only=True)
        if last["EPOCHS_RUN"] != DDP_EPOCHS:
            problems.append(f"final snapshot holds {last['EPOCHS_RUN']} epochs, expected {DDP_EPOCHS}")
    else:
        result = json.loads((folder / "snapshots" / "result.json").read_text())
        if (result["step"], result["attempt"]) != (HVD_STEPS, "1"):
            problems.append(f"final step/attempt {result['step']}/{result['attempt']}, "
                            f"expected {HVD_STEPS}/1")


def run_trials(kinds: list[str], trials: int, root: Path, seed: int | None = None,
               report: Callable[[int, Trial], None] | None = None) -> dict[str, list[Trial]]:
    """``trials`` trials of each kind, each in a folder of its own under ``root``."""
    rng = random.Random(seed)
    results: dict[str, list[Trial]] = {kind: [] for kind in kinds}
    for kind in kinds:
        for n in range(trials):
            folder = root / f"{kind}-{n}"
            folder.mkdir(parents=True)
            trial = run_trial(kind, folder, rng)
            results[kind].append(trial)
            if report is not None:
                report(n, trial)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--folder", default=None, help="where the trials run (a new temporary folder)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    import tempfile

    root = Path(args.folder or tempfile.mkdtemp(prefix="ringtrain-restart-trials-"))

    def report(n: int, trial: Trial) -> None:
        verdict = "ok" if trial.ok else "FAILED: " + "; ".join(trial.problems)
        print(f"{trial.kind} trial {n + 1}: killed rank {trial.killed_rank} after snapshot "
              f"{trial.newest_at_kill}, resumed at {trial.resumed_at}: {verdict}", flush=True)

    results = run_trials(args.kinds.split(","), args.trials, root, args.seed, report)
    print(f"\nresults (logs under {root}):")
    for kind, trials in results.items():
        print(f"  {kind:10s} {sum(t.ok for t in trials)} of {len(trials)} recovered")
    return 0 if all(t.ok for trials in results.values() for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
