"""Background snapshots: the rank blocks only for a copy, the writer process writes byte-for-byte the
snapshot a synchronous save writes, errors reach every rank at the next save or the end, and a rank
killed while its snapshot is written leaves a complete snapshot to restart from.

The quick tests share this process's snapshot writer (one helper process, started by the first of them
and kept, like multiprocessing's helpers); those on two ranks use the session's pool, whose ranks start
a writer each once.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ringtrain
from ringtrain.exceptions import DamagedSnapshotError, SnapshotError
from ringtrain.train import Trainer, TrainerConfig
from ringtrain.train.background_snapshots import (
    SnapshotTiming,
    TrainerSnapshots,
    wait_for_writers,
    writer_pids,
)
from ringtrain.train.snapshot_writer import ENV_FAIL, ENV_HOLD, ENV_SCHED, lock_name
from ringtrain.train.snapshots import SnapshotManager, snapshot_name
from ringtrain.workloads import TensorPairDataset

LINE = re.compile(r"^snapshot (\d+): blocked (\d+) ms, written in (\d+\.\d) s \((\d+(?:\.\d)?) (MB|kB)\)$")


class Tied(nn.Module):
    """Two layers sharing one weight (one storage viewed by two names), a buffer, a bf16 parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.out = nn.Linear(8, 16, bias=False)
        self.out.weight = self.embed.weight
        self.half = nn.Linear(8, 4).to(torch.bfloat16)
        self.register_buffer("count", torch.tensor(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(x))


def _state() -> dict[str, Any]:
    """A state with the shapes a real one has, and the odd cases of torch's pickling."""
    torch.manual_seed(0)
    model = Tied()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.tensor([1, 2, 3])).sum().backward()
    optimizer.step()
    flat = torch.arange(40, dtype=torch.float32)
    shared = torch.arange(3.0)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "views": [flat[3:9], flat.view(5, 8).t(), flat[::3]],  # one storage, saved whole, viewed three ways
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "unsigned": torch.tensor([1, 2, 3], dtype=torch.uint16),  # a dtype torch pickles the newer way
        "parameters": [nn.Parameter(torch.full((2,), float(n))) for n in range(12)]
        + [nn.Parameter(torch.zeros(3), requires_grad=False)],  # each reduced to a new tensor in turn
        "twice": {"a": shared, "b": [shared]},  # one tensor object in two places
        "mask": torch.tensor([True, False]),
        "config": {"device": "cpu", "strategy": "ddp", "seed": 0, "lr": 1e-3, "none": None, "pair": (1, 2)},
        "ordered": OrderedDict(a=1, b=[1.5, "storage"]),
        "epoch": 4,
    }


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


def test_a_background_snapshot_is_byte_for_byte_the_synchronous_one(tmp_path):
    state = _state()
    sync = SnapshotManager(tmp_path / "sync").save(state, 7)
    saves: list[SnapshotTiming] = []
    lines: list[str] = []
    writes = TrainerSnapshots(SnapshotManager(tmp_path / "bg"), 0, saves, lines.append)
    handle = writes.submit(7, state, None, 1, 0)
    assert writes.settle() is None
    background = tmp_path / "bg" / snapshot_name(7)
    assert handle.mode == "background"
    assert _bytes(background) == _bytes(sync)
    assert _bytes(background.with_suffix(".json")) == _bytes(sync.with_suffix(".json"))
    assert SnapshotManager(tmp_path / "bg").verify(background)
    assert [s.bytes for s in saves] == [background.stat().st_size]
    assert LINE.match(lines[0]), lines
    assert writer_pids(), "the writer is this process's helper, kept"


def test_the_api_writes_what_torch_save_writes_and_loads_it_verified(tmp_path):
    state = _state()
    path = tmp_path / "ckpt" / "epoch-4.pt"
    handle = ringtrain.save_snapshot(state, path)
    assert handle.wait() == path
    assert handle.done()
    assert handle.written_s is not None
    assert handle.bytes == path.stat().st_size
    expected = io.BytesIO()
    torch.save(state, expected)
    assert _bytes(path) == expected.getvalue()
    loaded = ringtrain.load_snapshot(path)
    assert torch.equal(loaded["views"][1], state["views"][1])
    assert loaded["views"][0].untyped_storage().data_ptr() == loaded["views"][2].untyped_storage().data_ptr()
    assert loaded["config"] == state["config"]
    assert loaded["twice"]["a"] is loaded["twice"]["b"][0]
    assert [p[0].item() for p in loaded["parameters"][:12]] == list(range(12))
    # a folder: the newest file that verifies; a damaged newer one is skipped
    ringtrain.save_snapshot({"epoch": 5, "w": torch.zeros(3)}, tmp_path / "ckpt" / "epoch-5.pt").wait()
    assert ringtrain.load_snapshot(tmp_path / "ckpt")["epoch"] == 5
    damaged = tmp_path / "ckpt" / "epoch-5.pt"
    data = bytearray(damaged.read_bytes())
    data[-40] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(DamagedSnapshotError, match="epoch-5.pt is damaged"):
        ringtrain.load_snapshot(damaged)
    assert ringtrain.load_snapshot(tmp_path / "ckpt")["epoch"] == 4
    (tmp_path / "empty").mkdir()
    assert ringtrain.load_snapshot(tmp_path / "empty") is None


def test_the_schedulers_signals_to_every_process_of_the_job_do_not_stop_the_writer(tmp_path):
    """Slurm's --signal=USR1@N and a cancel's SIGTERM reach every process of the job, the writer too
    (its own session keeps out only the terminal's): the rank decides, and the writer goes on writing."""
    ringtrain.save_snapshot({"w": torch.zeros(2)}, tmp_path / "first.pt").wait()  # the writer runs
    (pid,) = writer_pids()
    for name in ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGHUP", "SIGINT"):
        os.kill(pid, getattr(signal, name))
    path = ringtrain.save_snapshot({"w": torch.ones(2)}, tmp_path / "after.pt").wait()
    assert torch.equal(ringtrain.load_snapshot(path)["w"], torch.ones(2))
    assert writer_pids() == [pid]  # the same writer wrote it


def test_an_api_write_that_fails_names_the_file_and_the_reason_and_the_next_save_raises_it(tmp_path):
    folder = tmp_path / "ckpt"
    ringtrain.save_snapshot({"w": torch.ones(2)}, folder / "good.pt").wait()
    (folder / "bad.pt").mkdir()  # the rename cannot replace a folder
    handle = ringtrain.save_snapshot({"w": torch.ones(2)}, folder / "bad.pt")
    with pytest.raises(SnapshotError, match=r"cannot write snapshot .*bad.pt: Is a directory \(EISDIR\)"):
        handle.wait()
    failed = ringtrain.save_snapshot({"w": torch.ones(2)}, folder / "bad.pt")
    failed._event.wait()
    with pytest.raises(SnapshotError, match="bad.pt: Is a directory"):  # not waited for: said by the next
        ringtrain.save_snapshot({"w": torch.zeros(2)}, folder / "other.pt")
    assert torch.equal(ringtrain.load_snapshot(folder / "good.pt")["w"], torch.ones(2))
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_what_the_writer_cannot_carry_is_written_synchronously(tmp_path):
    sparse = torch.eye(3).to_sparse()
    handle = ringtrain.save_snapshot({"sparse": sparse}, tmp_path / "s.pt")
    assert handle.done()
    assert handle.mode == "sync"
    assert torch.equal(ringtrain.load_snapshot(tmp_path / "s.pt")["sparse"].to_dense(), torch.eye(3))


def test_a_restart_waits_for_a_writer_that_still_holds_the_folder(tmp_path):
    import fcntl

    lock = tmp_path / lock_name(1)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"1 a-host-far-away\n")
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        notes = wait_for_writers(tmp_path, timeout=0.2)
    finally:
        os.close(fd)
    assert notes == [f"a snapshot writer (pid 1 on a-host-far-away) is still writing in {tmp_path} after "
                     "0.2 s; going on without it"]
    assert wait_for_writers(tmp_path, timeout=0.2) == []  # free now


# --- the Trainer ---------------------------------------------------------------------------------------


def _blobs(n: int, seed: int) -> TensorPairDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + y[:, None].float()
    return TensorPairDataset(x, y)


def _trainer(folder: Path, on_step=None, items: int = 160, **config: Any) -> Trainer:
    """10 steps of 16 items a rank (``items`` = 160 x ranks), a snapshot after steps 3, 6, 9 and 10."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    settings = {"epochs": 1, "batch_size": 16, "progress": False, "threads": 1, "keep_last": 100,
                "save_every_steps": 3, "save_every": 1, **config}
    return Trainer(model, torch.optim.Adam(model.parameters(), lr=1e-2), nn.CrossEntropyLoss(),
                   _blobs(items, 1), None, TrainerConfig(snapshot_dir=str(folder), **settings),
                   on_step=on_step)


def test_the_trainer_writes_in_the_background_and_says_what_each_save_cost(tmp_path, capsys):
    trainer = _trainer(tmp_path / "bg")
    trainer.train()
    trainer.close()
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("snapshot ")]
    assert [int(LINE.match(line)[1]) for line in lines] == [3, 6, 9, 10], out
    assert [(t.step, t.mode, t.error) for t in trainer.snapshot_saves] == [
        (3, "background", None), (6, "background", None), (9, "background", None), (10, "background", None)]
    for timing in trainer.snapshot_saves:
        assert timing.blocked_s > 0
        assert timing.written_s is not None
        assert timing.bytes == (tmp_path / "bg" / snapshot_name(timing.step)).stat().st_size
    # the same run saved synchronously writes the same files
    sync = _trainer(tmp_path / "sync", snapshot_mode="sync")
    sync.train()
    sync.close()
    assert [t.mode for t in sync.snapshot_saves] == ["sync"] * 4
    assert "synchronous)" in capsys.readouterr().out
    for step in (3, 6, 9, 10):
        name = snapshot_name(step)
        assert _bytes(tmp_path / "bg" / name) == _bytes(tmp_path / "sync" / name)


def test_a_failed_write_is_raised_at_the_next_save_and_the_snapshots_there_stay(tmp_path, monkeypatch):
    def fail_from_step_5(trainer: Trainer) -> None:
        if trainer.step == 5:
            monkeypatch.setenv(ENV_FAIL, "ENOSPC:snapshot:0")

    trainer = _trainer(tmp_path, on_step=fail_from_step_5)
    try:
        full = r"cannot write snapshot .*-000000006.pt: No space left on device \(ENOSPC\)\. The snapshots"
        with pytest.raises(SnapshotError, match=full + " already there are intact"):
            trainer.train()
        assert trainer.step == 9  # raised by the save after the failed one
    finally:
        trainer.close(failed=True)
    manager = SnapshotManager(tmp_path)
    assert manager.list() == [tmp_path / snapshot_name(3)]
    assert manager.verify(tmp_path / snapshot_name(3))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_last_write_is_raised_before_train_returns(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_FAIL, "EIO:snapshot:0")
    trainer = _trainer(tmp_path, save_every_steps=None)
    try:
        with pytest.raises(SnapshotError, match=r"snapshot-000000010.pt: Input/output error \(EIO\)"):
            trainer.train()
    finally:
        trainer.close(failed=True)
    assert SnapshotManager(tmp_path).list() == []


# --- two ranks ----------------------------------------------------------------------------------------


def _rank_fails(folder: str, fail: str | None, sync_every: int | None) -> dict[str, Any]:
    """Train on this rank of the pool with ``RINGTRAIN_SNAPSHOT_TEST_FAIL=fail`` set from step 5 on."""
    def arm(trainer: Trainer) -> None:
        if trainer.step == 5 and fail:
            os.environ[ENV_FAIL] = fail

    trainer = _trainer(Path(folder), on_step=arm, items=320, sync_every=sync_every)
    try:
        trainer.train()
        return {"error": None, "step": trainer.step}
    except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
        return {"error": f"{type(exc).__name__}: {exc}", "step": trainer.step}
    finally:
        os.environ.pop(ENV_FAIL, None)
        trainer.close(failed=True)


def test_rank_0s_failed_write_stops_every_rank_at_the_next_save_naming_it(ranks2, tmp_path):
    first, second = ranks2.run(_rank_fails, str(tmp_path), "ENOSPC:snapshot:0", None, timeout=200)
    assert first["error"].startswith("SnapshotError: cannot write snapshot ")
    assert "(ENOSPC)" in first["error"]
    assert second["error"].startswith("SnapshotError: rank 0 failed writing a snapshot: cannot write "
                                      "snapshot ")
    assert "snapshot-000000006.pt: No space left on device (ENOSPC)" in second["error"]
    assert first["step"] == second["step"] == 9
    assert SnapshotManager(tmp_path).list() == [tmp_path / snapshot_name(3)]


def test_a_part_that_fails_on_rank_1_keeps_rank_0_from_committing_and_stops_both(ranks2, tmp_path):
    first, second = ranks2.run(_rank_fails, str(tmp_path), "EIO:part:1", 2, timeout=200)
    assert first["error"].startswith("SnapshotError: rank 1 failed writing a snapshot: rank 1 cannot write "
                                     "its part ")
    assert second["error"].startswith("SnapshotError: rank 1 cannot write its part ")
    assert "snapshot-000000006.rank-00001.pt" in second["error"]
    assert "(EIO)" in second["error"]
    manager = SnapshotManager(tmp_path)
    assert manager.list() == [tmp_path / snapshot_name(3)]  # step 6 was never committed
    assert [r["file"] for r in manager.part_records(tmp_path / snapshot_name(3))] == [
        "snapshot-000000003.rank-00000.pt", "snapshot-000000003.rank-00001.pt"]
    for rank in (0, 1):
        assert manager.load_part(tmp_path / snapshot_name(3), rank)["rank"] == rank


def _parts_in_background(folder: str) -> dict[str, Any]:
    trainer = _trainer(Path(folder), items=320, sync_every=2)
    try:
        trainer.train()
        return {"modes": [t.mode for t in trainer.snapshot_saves], "parts": [t.part_bytes for t in
                                                                          trainer.snapshot_saves]}
    finally:
        trainer.close()


def test_parts_of_every_rank_are_committed_with_rank_0s_snapshot(ranks2, tmp_path):
    results = ranks2.run(_parts_in_background, str(tmp_path), timeout=200)
    for result in results:
        assert result["modes"] == ["background"] * 4
        assert all(result["parts"])
    manager = SnapshotManager(tmp_path)
    assert [p.name for p in manager.list()] == [snapshot_name(s) for s in (3, 6, 9, 10)]
    for path in manager.list():
        assert manager.verify(path)
        for rank in (0, 1):
            assert manager.load_part(path, rank)["rank"] == rank
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no record left behind


# --- processes killed while a snapshot is written -------------------------------------------------------

HANDS_OVER = textwrap.dedent("""
    import os, sys, time, torch, ringtrain
    ringtrain.save_snapshot({"w": torch.arange(1000)}, sys.argv[1] + "/old.pt").wait()
    os.environ["RINGTRAIN_ATTEMPT"] = "1"  # the test hook holds this one (it waits for release.1)
    handle = ringtrain.save_snapshot({"w": torch.arange(1_000_000)}, sys.argv[1] + "/new.pt")
    print("handed over", flush=True)
    time.sleep(600)  # killed before it gets here
""")


@pytest.mark.slow
@pytest.mark.parametrize("writer_too", [False, True])
def test_a_process_killed_after_handing_over_still_gets_its_snapshot_unless_the_writer_dies(tmp_path,
                                                                                         writer_too):
    hold = tmp_path / "hold"
    env = {**os.environ, ENV_HOLD: str(hold), ENV_SCHED: "nice"}
    env.pop("RANK", None)
    hold.mkdir()
    (hold / "release.0").touch()  # the first save goes through
    proc = subprocess.Popen([sys.executable, "-c", HANDS_OVER, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "handed over"
        held = hold / "held.1.0.0.file.json"
        deadline = time.monotonic() + 120
        while not held.exists():  # the writer stands before its rename
            assert time.monotonic() < deadline, "the writer was never held"
            time.sleep(0.02)
        marker = json.loads(held.read_text())
        proc.kill()  # SIGKILL of the rank while its writer is about to commit
        proc.wait(timeout=60)
        if writer_too:
            os.kill(marker["writer_pid"], signal.SIGKILL)
        (hold / "release.1").touch()
        # the writer holds its lock until it is done (or dead): what a restart waits for
        assert wait_for_writers(tmp_path, timeout=120) == []
    finally:
        (hold / "release.1").touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert torch.equal(ringtrain.load_snapshot(tmp_path / "old.pt")["w"], torch.arange(1000))
    if writer_too:
        assert not (tmp_path / "new.pt").exists()
        assert [p.name for p in tmp_path.glob(".snapshot-new.*.tmp")]  # a leftover, never read as a snapshot
        SnapshotManager(tmp_path).remove_stale_temporaries()
        assert not list(tmp_path.glob("*.tmp"))
    else:
        assert torch.equal(ringtrain.load_snapshot(tmp_path / "new.pt")["w"], torch.arange(1_000_000))


KILLED_JOB = textwrap.dedent("""
    import sys
    import torch
    from torch import nn
    from ringtrain.train import Trainer, TrainerConfig
    from ringtrain.workloads import TensorPairDataset

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    data = TensorPairDataset(x, (x.sum(1) > 0).long())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    config = TrainerConfig(epochs=2, batch_size=16, sync_every=2, save_every_steps=2, save_every=1,
                           snapshot_dir=sys.argv[1], keep_last=1000, progress=False, threads=1,
                           signals_to_handle="")
    with Trainer(model, torch.optim.SGD(model.parameters(), lr=0.05), nn.CrossEntropyLoss(), data,
                 config=config) as trainer:
        trainer.train()
        print("finished at step", trainer.step, flush=True)
""")
#: (rank killed, whose writers are killed with it) for each attempt: the writers finish the snapshot
#: (the new one is resumed), or die with the rank (the newest complete one before it is resumed).
KILLS = [(1, "none"), (0, "none"), (0, "all"), (1, "all"), (0, "victim's"), (1, "none"), (0, "none"),
         (1, "victim's"), (1, "all"), (0, "none")]


@pytest.mark.slow
def test_a_rank_killed_while_its_snapshot_is_written_restarts_from_a_complete_one(tmp_path):
    """Ten SIGKILLs of a rank of one 2-rank job (``--max-restarts 10``), each while both ranks' writers
    are held (the test hook) just before renaming their parts of a snapshot; the writers then finish it, or
    are killed too. Each restart resumes from the newest snapshot that was completed, never a partial one."""
    hold, snaps, script = tmp_path / "hold", tmp_path / "snaps", tmp_path / "job.py"
    hold.mkdir()
    script.write_text(KILLED_JOB)
    # the writers at niceness 10, not idle-only: on a machine as busy as the full suite makes it, an idle-only
    # writer may wait for a free core longer than a restart's patience, and this test is about crashes
    env = {**os.environ, ENV_HOLD: str(hold), ENV_SCHED: "nice", "OMP_NUM_THREADS": "1",
           "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "job.log"
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", "--max-restarts", str(len(KILLS)),
            sys.executable, str(script), str(snaps)]
    expected = []
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        for attempt, (victim, writers) in enumerate(KILLS):
            deadline = time.monotonic() + 300
            markers = {}
            while len(markers) < 2:
                for path in hold.glob(f"held.{attempt}.*.part.json"):
                    body = json.loads(path.read_text())
                    markers[body["rank"]] = body
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"attempt {attempt}: none held\n{log.read_text()[-3000:]}"
                time.sleep(0.02)
            held_step = markers[0]["step"]
            assert markers[1]["step"] == held_step
            committed = [int(p.stem.split("-")[1]) for p in SnapshotManager(snaps).list()]
            os.kill(markers[victim]["rank_pid"], signal.SIGKILL)
            if writers != "none":
                for rank in ((0, 1) if writers == "all" else (victim,)):
                    os.kill(markers[rank]["writer_pid"], signal.SIGKILL)
            (hold / f"release.{attempt}").touch()
            expected.append(held_step if writers == "none" else max(committed, default=-1))
        (hold / f"release.{len(KILLS)}").touch()
        code = proc.wait(timeout=600)
    finally:
        for attempt in range(len(KILLS) + 1):  # no writer stays held
            (hold / f"release.{attempt}").touch()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert code == 0, text[-5000:]
    assert text.count("restarting every rank") == len(KILLS), text[-5000:]
    resumed = [int(n) for n in re.findall(r"resumed from \S+ \(epoch \d+, batch \d+, step (\d+)\)", text)]
    assert resumed == [step for step in expected if step >= 0], (resumed, expected)
    assert "finished at step 32" in text
    manager = SnapshotManager(snaps)
    for path in manager.list():  # every committed snapshot is complete: verified, every part there
        assert manager.verify(path)
        for rank in (0, 1):
            manager.load_part(path, rank)
    assert not list(snaps.glob(".snapshot-*.tmp"))
    assert not any(p.name.endswith(".tmp") for p in snaps.iterdir())
