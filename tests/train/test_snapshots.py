"""Snapshots: atomic against a killed writer, refused with a clear error when damaged or foreign."""

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch import nn

from ringtrain.train.snapshots import SnapshotError, SnapshotManager, model_fingerprint, snapshot_name

KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import torch
    from ringtrain.train.snapshots import SnapshotManager

    manager = SnapshotManager(sys.argv[1], keep_last=5)
    manager.save({"model": {"w": torch.ones(3)}, "step": 1}, step=1)

    def die_before_rename(temp, final):
        # the new snapshot is fully written to its temporary file; the process dies before the rename
        os.kill(os.getpid(), signal.SIGKILL)

    manager._commit = die_before_rename
    manager.save({"model": {"w": torch.zeros(2_000_000)}, "step": 2}, step=2)
""")


def test_writer_killed_before_rename_leaves_previous_snapshot(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], capture_output=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    manager = SnapshotManager(tmp_path)
    assert [p.name for p in manager.list()] == [snapshot_name(1)]
    body = manager.load(manager.latest())
    assert torch.equal(body["model"]["w"], torch.ones(3))
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1  # the dead writer's temporary file, never listed
    manager.remove_stale_temporaries()
    assert sorted(p.name for p in tmp_path.iterdir()) == [snapshot_name(1)]


KILLED_MID_WRITE = textwrap.dedent("""
    import sys
    import torch
    from ringtrain.train.snapshots import SnapshotManager

    manager = SnapshotManager(sys.argv[1], keep_last=100)
    manager.save({"model": {"w": torch.ones(3)}}, step=1)
    print("first", flush=True)
    step = 2
    while True:  # large snapshots, until the parent kills us (most likely in the middle of a write)
        manager.save({"model": {"w": torch.rand(4_000_000)}}, step=step)
        step += 1
""")


def test_writer_killed_mid_write_never_leaves_a_partial_snapshot(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"first"
        # wait until a large write has started, then kill
        while proc.poll() is None and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    manager = SnapshotManager(tmp_path)
    for path in manager.list():  # every committed snapshot loads completely
        assert "w" in manager.load(path)["model"]


def test_truncated_snapshot_names_the_file_and_the_fix(tmp_path):
    manager = SnapshotManager(tmp_path)
    path = manager.save({"model": {"w": torch.ones(1000)}}, step=7)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="HINT: delete") as info:
        manager.load(path)
    assert str(path) in str(info.value)


def test_garbage_and_pickles_are_refused(tmp_path):
    manager = SnapshotManager(tmp_path)
    garbage = tmp_path / snapshot_name(1)
    garbage.write_bytes(b"not a snapshot at all")
    with pytest.raises(SnapshotError, match=str(garbage)):
        manager.load(garbage)
    foreign = tmp_path / snapshot_name(2)
    torch.save({"model": {}, "hook": print}, foreign)  # a pickle of an arbitrary object: never unpickled
    with pytest.raises(SnapshotError, match="weights_only"):
        manager.load(foreign)
    plain = tmp_path / snapshot_name(3)
    torch.save({"weights": torch.ones(2)}, plain)  # loadable, but no ringtrain marker
    with pytest.raises(SnapshotError, match="not a ringtrain snapshot"):
        manager.load(plain)


def test_snapshot_of_another_model_is_refused(tmp_path):
    manager = SnapshotManager(tmp_path)
    small, large = nn.Linear(3, 2), nn.Linear(5, 2)
    path = manager.save({"model": small.state_dict(), "fingerprint": model_fingerprint(small)}, step=1)
    assert manager.load(path, model_fingerprint(nn.Linear(3, 2)))["fingerprint"] == model_fingerprint(small)
    with pytest.raises(SnapshotError, match="different model") as info:
        manager.load(path, model_fingerprint(large))
    assert str(path) in str(info.value)
    assert "HINT" in str(info.value)


def test_keep_last_prunes_oldest_by_step(tmp_path):
    manager = SnapshotManager(tmp_path, keep_last=2)
    for step in (5, 10, 100, 1000):
        manager.save({"step": step}, step=step)
    assert [p.name for p in manager.list()] == [snapshot_name(100), snapshot_name(1000)]
    assert manager.latest().name == snapshot_name(1000)
    assert manager.load(manager.latest())["step"] == 1000


def test_empty_or_missing_folder_has_no_latest(tmp_path):
    assert SnapshotManager(tmp_path / "absent").latest() is None
    assert SnapshotManager(tmp_path).latest() is None
    with pytest.raises(ValueError, match="keep_last=0"):
        SnapshotManager(tmp_path, keep_last=0)
