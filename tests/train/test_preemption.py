"""Graceful stop on a signal: every rank stops after the same step, one snapshot, exit 75, resumable."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ringtrain.train.preemption import (
    PREEMPTED_EXIT,
    StopAgreement,
    StopSignals,
    parse_signals,
    stop_requested,
)


def test_signal_names_parse_like_torchrun_and_bad_ones_are_refused():
    assert parse_signals("SIGTERM,SIGUSR1") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_signals("TERM, usr1,SIGTERM") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_signals("") == ()
    with pytest.raises(ValueError, match="'SIGKILL' is not a signal that can be handled. HINT"):
        parse_signals("SIGKILL")
    with pytest.raises(ValueError, match="'NOPE'"):
        parse_signals("NOPE")


def two_rank_sums(started: list[list[torch.Tensor]]):
    """``sum_async_of(rank)``: a sum between two ranks done by hand, the n-th call of each rank adding
    up both ranks' n-th tensors (as the collective would); ``started`` keeps what each rank gave."""

    def sum_async_of(rank):
        def sum_async(tensor):
            started[rank].append(tensor)
            index = len(started[rank]) - 1
            return lambda: started[0][index] + started[1][index]
        return sum_async
    return sum_async_of


def test_the_agreement_answers_one_step_late_and_the_same_for_every_rank():
    """Two ranks with a real sum between them (done by hand, step by step, as the collective would)."""
    started: list[list[torch.Tensor]] = [[], []]
    sum_async_of = two_rank_sums(started)

    handlers = [StopSignals([signal.SIGUSR1]), StopSignals([signal.SIGUSR1])]
    ranks = [StopAgreement(sum_async_of(r), handlers[r], rank=r, every_s=0.0) for r in range(2)]
    assert [r.poll() for r in ranks] == [0, 0]  # step 1: nothing pending yet
    handlers[1].received = signal.SIGUSR1  # rank 1 alone gets the signal during step 2
    assert [r.poll() for r in ranks] == [0, 0]  # step 2 reads step 1's sum
    assert [r.poll() for r in ranks] == [signal.SIGUSR1, signal.SIGUSR1]  # step 3: both stop here


def test_rank_0_paces_the_sums_and_every_rank_reads_them_after_the_same_steps():
    """Steps of 10 ms and every_s 0.05: after the first read, a sum every 5 steps on both ranks."""
    started: list[list[torch.Tensor]] = [[], []]
    sum_async_of = two_rank_sums(started)
    now = [0.0]

    handlers = [StopSignals([signal.SIGUSR1]), StopSignals([signal.SIGUSR1])]
    ranks = [StopAgreement(sum_async_of(r), handlers[r], rank=r, every_s=0.05, clock=lambda: now[0])
             for r in range(2)]
    answers = []
    for step in range(1, 40):
        now[0] += 0.01
        if step == 20:
            handlers[0].received = signal.SIGUSR1  # rank 0 alone, during step 20
        answers.append([r.poll() for r in ranks])
        if answers[-1] != [0, 0]:
            break
    assert ranks[0].every == ranks[1].every == 5
    assert len(started[0]) == len(started[1]) < 10  # a sum every 5 steps, not one a step
    assert answers[-1] == [signal.SIGUSR1, signal.SIGUSR1]  # the same answer after the same step
    assert step - 20 <= 2 * 5  # within two intervals of the signal


def test_handlers_note_the_signal_instead_of_dying():
    handlers = StopSignals([signal.SIGUSR1]).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while handlers.received is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert handlers.received == signal.SIGUSR1
    finally:
        handlers.uninstall()


def test_stop_requested_answers_for_this_process_without_a_job():
    from ringtrain.train import preemption

    state: dict = {}
    assert stop_requested(state) is False
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not stop_requested(state) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stop_requested(state) is True
    finally:
        state["handlers"].uninstall()
    assert preemption.PREEMPTED_EXIT == 75


# --- end to end: kill -9, -USR1, -TERM of `ringtrain train mnist -np 2` mid-epoch, then the same command ---

# A signal stops the ranks within about two of the agreement's half-second intervals: up to a hundred
# steps on a fast machine. Each stop of the test needs that many steps left after it, so the job is 225
# steps long (on a 2-core Intel Xeon, 2,000 items and 64 steps were too few: a SIGTERM came after the end).
SUBSET, EPOCHS = 4800, 3
STEPS_PER_EPOCH = 75  # 4800 items / (2 ranks x 32)


def _argv(snaps: Path, results: Path) -> list[str]:
    return [sys.executable, "-m", "ringtrain.cli.main", "train", "mnist", "-np", "2", "--subset", str(SUBSET),
            "--epochs", str(EPOCHS), "--batch-size", "32", "--save-every-steps", "4",
            "--snapshot-dir", str(snaps), "--keep-last", "20", "--no-progress", "--threads", "1",
            "--results-json", str(results)]


def _steps(snaps: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in snaps.glob("snapshot-*.pt"))


def _stop_with(sig: int, snaps: Path, results: Path, after: int) -> tuple[subprocess.Popen, str, int, Path]:
    """Start the command, send ``sig`` once it wrote a snapshot past step ``after``; (process, its stdout,
    the step it stopped at, its snapshot), with every assertion on the stop itself made here."""
    proc = subprocess.Popen(_argv(snaps, results), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not [s for s in _steps(snaps) if s > after]:  # a step snapshot of this run: it is training
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no snapshot appeared"
            time.sleep(0.05)
        proc.send_signal(sig)
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=120)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT, err
    assert seconds < 10, err
    line = next(x for x in err.splitlines() if x.startswith("ringtrain train: preempted at step "))
    step = int(line.split("preempted at step ")[1].split(",")[0])
    snapshot = Path(line.split(", snapshot ")[1].split(" (")[0])
    assert snapshot == snaps / f"snapshot-{step:09d}.pt"
    assert snapshot.exists()
    assert max(4, after + 1) <= step < EPOCHS * STEPS_PER_EPOCH
    assert max(_steps(snaps)) == step  # the agreed step's snapshot is the last one written
    assert "Run the same command again to resume from it." in line
    assert not results.exists()
    return proc, out, step, snapshot


def _kill_after_a_snapshot(snaps: Path, results: Path) -> int:
    """Start the command, SIGKILL the launcher and every rank at once (a lost node) once a step snapshot
    exists; the step of the newest snapshot left."""
    from tests.examples.launch import kill_tree

    first = subprocess.Popen(_argv(snaps, results), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not _steps(snaps):
            assert first.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no step snapshot appeared"
            time.sleep(0.05)
    finally:
        kill_tree(first)  # the launcher and every rank at once, like a lost node
    assert not results.exists()
    killed_at = max(_steps(snaps))
    assert killed_at < STEPS_PER_EPOCH  # mid-epoch 1
    return killed_at


@pytest.mark.slow
def test_a_kill_and_signals_mid_epoch_each_resume_with_the_same_command(tmp_path):
    """One job, stopped three ways, each time resumed by the same command: SIGKILL of every process
    mid-epoch (the last step snapshot survives); kill -USR1 of the resumed run (snapshot, exit 75);
    kill -TERM of the next (the same); then the same command resumes and ends where an uninterrupted run
    would. (One job for all three: each stop is checked as a fresh run's would be; two start-ups and two
    whole runs fewer than a job each.)"""
    snaps, results = tmp_path / "snaps", tmp_path / "results.json"
    killed_at = _kill_after_a_snapshot(snaps, results)
    _, out, first_step, first = _stop_with(signal.SIGUSR1, snaps, results, after=killed_at)
    assert f"resumed from {snaps / f'snapshot-{killed_at:09d}.pt'}" in out
    _, out, second_step, second = _stop_with(signal.SIGTERM, snaps, results, after=first_step)
    assert f"resumed from {first}" in out

    again = subprocess.run(_argv(snaps, results), capture_output=True, text=True, timeout=400)
    assert again.returncode == 0, again.stderr
    assert f"resumed from {second}" in again.stdout
    body = json.loads(results.read_text())
    assert body["resumed_from"] is not None
    assert Path(body["resumed_from"]).name.startswith("snapshot-")
    # the epochs this last run finished: from the one its snapshot is in to the end. Which epoch the
    # SIGTERM came in depends on how fast the machine is: step 74 is still epoch 1, step 75 ended it.
    assert [e["epoch"] for e in body["epochs"]] == list(range(second_step // STEPS_PER_EPOCH + 1, EPOCHS + 1))
    assert body["epochs"][-1]["steps"] == EPOCHS * STEPS_PER_EPOCH  # the step count of an uninterrupted run
    assert body["epochs"][-1]["epoch"] == EPOCHS
    assert body["epochs"][-1]["accuracy"] > 0.85


def test_the_trainer_stops_with_a_snapshot_when_the_allocation_ends_within_the_margin(tmp_path, monkeypatch):
    from torch import nn

    from ringtrain.train import Trainer, TrainerConfig
    from ringtrain.train.preemption import Preempted
    from ringtrain.workloads import TensorPairDataset

    # Slurm's end time 60 s from now, a 120 s margin: past the deadline from the first step on
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 60))
    g = torch.Generator().manual_seed(0)
    data = TensorPairDataset(torch.randn(160, 4, generator=g), torch.randint(0, 2, (160,), generator=g))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), data, None,
                      TrainerConfig(epochs=3, batch_size=16, progress=False, threads=1,
                                    snapshot_dir=str(tmp_path), signals_to_handle="",
                                    walltime_margin_s=120.0))
    try:
        with pytest.raises(Preempted) as stopped:
            trainer.train()
    finally:
        trainer.close()
    # step 1 starts the agreement's sum, step 2 reads it: every rank stops after step 2
    assert stopped.value.step == 2
    assert stopped.value.snapshot == tmp_path / "snapshot-000000002.pt"
    assert stopped.value.snapshot.exists()
    assert "allocation's end is near" in str(stopped.value)

    monkeypatch.delenv("SLURM_JOB_END_TIME")
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    again = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), data, None,
                    TrainerConfig(epochs=3, batch_size=16, progress=False, threads=1,
                                  snapshot_dir=str(tmp_path)))
    try:
        history = again.train()
    finally:
        again.close()
    assert again.resumed_from == tmp_path / "snapshot-000000002.pt"
    assert history[-1].steps == 30  # 160 / 16 = 10 steps an epoch, as many as without the stop
