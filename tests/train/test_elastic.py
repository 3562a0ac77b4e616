"""The Trainer's elastic mode: ``ringtrain train --min-np/--max-np`` goes on in process after a worker is
killed, from its last commit, and ends with the right step count; bad combinations are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.train.config import TrainerConfig
from ringtrain.train.strategies import make_strategy
from tests.integration.system import clean_env, wait_for


def test_elastic_needs_the_horovod_strategy():
    with pytest.raises(ValueError, match="elastic=True needs strategy='horovod'"):
        TrainerConfig(elastic=True, strategy="ddp")
    with pytest.raises(ValueError, match="HINT: use strategy='horovod'"):
        make_strategy("ddp", elastic=True)
    assert TrainerConfig(elastic=True, strategy="horovod").elastic
    assert TrainerConfig().elastic is None  # auto: on under ringtrain run's elastic driver


def test_elastic_commits_may_come_without_snapshots():
    TrainerConfig(elastic=True, strategy="horovod", save_every_steps=10)
    with pytest.raises(ValueError, match="snapshot_dir"):
        TrainerConfig(strategy="horovod", save_every_steps=10)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--min-np", "1", "--strategy", "ddp"],
     "an elastic job (--min-np, --max-np or --host-discovery-script) needs --strategy horovod, not "
     "--strategy ddp"),
    (["-np", "3", "--min-np", "1", "--max-np", "2"], "-np 3 lies outside --min-np 1 .. --max-np 2"),
    (["--min-np", "2", "--max-np", "1"], "is not a range of worker counts"),
])
def test_bad_elastic_train_flags_exit_2(argv, needle, capsys):
    assert main(["train", "mnist", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "HINT:" in err


@pytest.mark.slow
def test_killed_worker_costs_only_the_work_since_the_last_commit(tmp_path: Path):
    log = tmp_path / "train.log"
    argv = [sys.executable, "-m", "ringtrain", "train", "mnist", "-np", "2", "--min-np", "1", "--max-np", "2",
            "--epochs", "2", "--subset", "2000", "--batch-size", "32", "--save-every-steps", "5",
            "--snapshot-dir", str(tmp_path / "snaps"), "--no-progress", "--results-json",
            str(tmp_path / "results.json")]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=tmp_path,
                                start_new_session=True)
    try:
        # the first step snapshot is also the first in-memory commit
        wait_for(lambda: any((tmp_path / "snaps").glob("snapshot-*.pt")) or proc.poll() is not None, 540,
                 "the first snapshot", logs=[log])
        victim = _worker_pid(proc.pid, "w2")
        assert victim is not None, log.read_text()
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text()
    assert code == 0, output
    assert "worker w2 (rank 1 on localhost) failed: killed by SIGKILL" in output
    assert "ringtrain train: the group re-formed with 2 rank(s); going on from epoch 1" in output
    results = json.loads((tmp_path / "results.json").read_text())
    # 1000 items per rank / 32 per batch = 32 steps per epoch, whatever was redone after the kill
    assert [(e["epoch"], e["steps"]) for e in results["epochs"]] == [(1, 32), (2, 64)]
    assert results["epochs"][-1]["accuracy"] > 0.5


def _worker_pid(driver: int, worker: str) -> int | None:
    """The process of elastic worker ``worker`` that ``driver`` started (the Python running the Trainer)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if parent == driver and f"RINGTRAIN_ELASTIC_WORKER={worker}".encode() in environ:
            return int(entry)
    return None
