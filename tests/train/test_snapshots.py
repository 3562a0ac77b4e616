"""Snapshots: atomic against a killed writer, refused with a clear error when damaged or foreign."""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from ringtrain.exceptions import DamagedSnapshotError
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


@pytest.mark.slow
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
    # the snapshot and its checksum file; step 2's checksum file, written before the commit, is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-000000001.json", snapshot_name(1)]


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


@pytest.mark.slow
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


# --- verification: checksums, damaged snapshots skipped, the previous format --------------------------

def _flip(path, offset_fraction=0.5, length=4096):
    """Invert ``length`` bytes in the middle of ``path``, in place (size unchanged): a damaged block."""
    data = bytearray(path.read_bytes())
    start = int(len(data) * offset_fraction)
    data[start:start + length] = bytes(b ^ 0xFF for b in data[start:start + length])
    path.write_bytes(bytes(data))


def _three_snapshots(folder):
    manager = SnapshotManager(folder, keep_last=5)
    for step in (1, 2, 3):
        manager.save({"model": {"w": torch.full((20_000,), float(step))}, "step": step}, step=step)
    return manager


def test_every_snapshot_is_written_with_its_checksum_and_verifies(tmp_path):
    manager = _three_snapshots(tmp_path)
    for path in manager.list():
        assert path.with_suffix(".json").exists()
        assert manager.verify(path) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [snapshot_name(s) for s in (1, 2, 3)] + [snapshot_name(s)[:-3] + ".json" for s in (1, 2, 3)])


def test_a_flipped_block_is_detected_and_the_newest_good_snapshot_is_taken(tmp_path):
    manager = _three_snapshots(tmp_path)
    latest = manager.latest()
    _flip(latest)
    with pytest.raises(DamagedSnapshotError, match="SHA-256") as info:
        manager.load(latest)
    assert str(latest) in str(info.value)
    assert "HINT:" in str(info.value)
    path, body, skipped = manager.load_newest()
    assert path.name == snapshot_name(2)
    assert torch.equal(body["model"]["w"], torch.full((20_000,), 2.0))
    assert len(skipped) == 1
    assert snapshot_name(3) in skipped[0]


def test_a_truncated_or_unreadable_snapshot_is_skipped_too(tmp_path):
    manager = _three_snapshots(tmp_path)
    latest = manager.latest()
    latest.write_bytes(latest.read_bytes()[:1000])
    manager.list()[1].with_suffix(".json").write_text("{not json")
    path, _, skipped = manager.load_newest()
    assert path.name == snapshot_name(1)
    assert "1000 bytes" in skipped[0]
    assert "checksum file" in skipped[1]


def test_when_every_snapshot_is_damaged_the_error_names_them_all(tmp_path):
    manager = _three_snapshots(tmp_path)
    for path in manager.list():
        _flip(path)
    with pytest.raises(DamagedSnapshotError) as info:
        manager.load_newest()
    message = str(info.value)
    for step in (1, 2, 3):
        assert snapshot_name(step) in message
    assert "HINT: delete them" in message


def test_a_snapshot_of_the_previous_format_loads_unverified(tmp_path, caplog):
    # the earlier ringtrain wrote the same body, without a checksum file
    legacy = tmp_path / snapshot_name(4)
    torch.save({"format": "ringtrain-snapshot-1", "model": {"w": torch.ones(3)}, "step": 4}, legacy)
    manager = SnapshotManager(tmp_path)
    assert manager.verify(legacy) is False
    with caplog.at_level("WARNING"):
        path, body, skipped = manager.load_newest()
    assert (path, skipped) == (legacy, [])
    assert torch.equal(body["model"]["w"], torch.ones(3))
    assert "no checksum file" in caplog.text


def test_a_writer_killed_between_checksum_and_commit_leaves_nothing_listed(tmp_path):
    manager = SnapshotManager(tmp_path)
    manager.save({"model": {"w": torch.ones(3)}}, step=1)

    def die(temp, final):
        raise KeyboardInterrupt  # killed after the checksum file, before the rename that commits

    manager._commit = die
    with pytest.raises(KeyboardInterrupt):
        manager.save({"model": {"w": torch.zeros(3)}}, step=2)
    assert [p.name for p in manager.list()] == [snapshot_name(1)]
    manager.remove_stale_temporaries()  # the checksum of the snapshot that never was goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-000000001.json", snapshot_name(1)]


@pytest.mark.slow
def test_writer_killed_at_a_random_moment_leaves_a_good_newest_snapshot(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"first"
        time.sleep(__import__("random").uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    manager = SnapshotManager(tmp_path)
    manager.remove_stale_temporaries()
    path, body, skipped = manager.load_newest()
    assert skipped == []
    assert manager.verify(path) is True
    assert "w" in body["model"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_prune_removes_checksum_files_with_their_snapshots(tmp_path):
    manager = SnapshotManager(tmp_path, keep_last=1)
    for step in (1, 2):
        manager.save({"step": step}, step=step)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-000000002.json", snapshot_name(2)]


@pytest.mark.parametrize("kind", ["file", "under-a-file", "proc"])
def test_an_unusable_snapshot_folder_is_refused_naming_it(tmp_path, kind):
    if kind == "file":
        folder = tmp_path / "snaps"
        folder.write_text("a file")
    elif kind == "under-a-file":
        (tmp_path / "plain").write_text("a file")
        folder = tmp_path / "plain" / "snaps"
    else:
        folder = Path("/proc/ringtrain-snapshots")  # no one may create files here, not even root
    manager = SnapshotManager(folder)
    with pytest.raises(SnapshotError) as info:
        manager.check_writable()
    assert str(folder) in str(info.value)
    assert "HINT: point --snapshot-dir" in str(info.value)
    with pytest.raises(SnapshotError, match="cannot write snapshot"):
        manager.save({"step": 1}, step=1)


def test_a_writable_folder_passes_and_keeps_no_probe(tmp_path):
    SnapshotManager(tmp_path / "new" / "snaps").check_writable()
    assert list((tmp_path / "new" / "snaps").iterdir()) == []


def test_a_lazy_load_maps_the_tensors_and_verifies_all_the_same(tmp_path):
    manager = SnapshotManager(tmp_path)
    path = manager.save({"model": {"w": torch.arange(6.0)}, "epoch": 2, "config": {"seed": 1}}, step=7)
    found, body, skipped = manager.load_newest(lazy=True)
    assert (found, skipped) == (path, [])
    assert (body["epoch"], body["config"]) == (2, {"seed": 1})
    assert torch.equal(body["model"]["w"], torch.arange(6.0))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedSnapshotError, match="is damaged"):
        manager.load(path, lazy=True)


def test_a_verified_snapshot_is_preferred_to_a_newer_unverified_one(tmp_path, caplog):
    manager = SnapshotManager(tmp_path, keep_last=5)
    manager.save({"model": {"w": torch.ones(2)}}, step=1)
    manager.save({"model": {"w": torch.zeros(2)}}, step=2)
    (tmp_path / "snapshot-000000002.json").unlink()  # the newest lost its checksum file
    path, body, skipped = manager.load_newest()
    assert path is not None
    assert path.name == snapshot_name(1)
    assert torch.equal(body["model"]["w"], torch.ones(2))
    assert len(skipped) == 1
    assert snapshot_name(2) in skipped[0]
    assert "no checksum file" in skipped[0]


def test_an_unverified_snapshot_loads_only_where_none_verifies_and_says_so(tmp_path, caplog):
    manager = SnapshotManager(tmp_path, keep_last=5)
    manager.save({"model": {"w": torch.ones(2)}}, step=1)
    manager.save({"model": {"w": torch.zeros(2)}}, step=2)
    for checksum in tmp_path.glob("*.json"):
        checksum.unlink()
    with caplog.at_level("WARNING"):
        path, body, skipped = manager.load_newest()
    assert path is not None
    assert path.name == snapshot_name(2)
    assert skipped == []
    assert "no snapshot there verifies: loading it unverified" in caplog.text


def test_a_full_disk_is_reported_as_enospc_not_as_torchs_writer_position(tmp_path, monkeypatch):
    import builtins
    import errno

    real_open = builtins.open

    class Full:
        def __init__(self, fp):
            self.fp, self.written = fp, 0

        def write(self, data):
            if self.written + len(data) > 1000:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += len(data)
            return self.fp.write(data)

        def __getattr__(self, name):
            return getattr(self.fp, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fp.close()

    def small_disk(path, mode="r", *args, **kwargs):
        fp = real_open(path, mode, *args, **kwargs)
        return Full(fp) if str(path).endswith(".tmp") and "b" in mode else fp

    manager = SnapshotManager(tmp_path)
    monkeypatch.setattr(builtins, "open", small_disk)
    with pytest.raises(SnapshotError, match=r"No space left on device \(ENOSPC\)"):
        manager.save({"model": {"w": torch.rand(10_000)}}, step=3)
    monkeypatch.undo()
    assert not list(tmp_path.iterdir())  # nothing half-written is left


# --- parts: what each rank keeps of its own, committed with the snapshot ----------------------------


def _with_parts(manager: SnapshotManager, step: int, ranks: int = 2) -> Path:
    records = [manager.save_part({"errors": torch.full((3,), float(rank + step))}, step, rank)
               for rank in range(ranks)]
    return manager.save({"model": {"w": torch.ones(2)}, "step": step}, step, parts=records)


def test_each_rank_reads_its_own_part_of_a_committed_snapshot(tmp_path):
    manager = SnapshotManager(tmp_path)
    path = _with_parts(manager, 5)
    assert manager.verify(path)
    assert manager.load(path)["parts"] == 2
    assert [r["file"] for r in manager.part_records(path)] == ["snapshot-000000005.rank-00000.pt",
                                                               "snapshot-000000005.rank-00001.pt"]
    for rank in (0, 1):
        assert torch.equal(manager.load_part(path, rank)["errors"], torch.full((3,), 5.0 + rank))
    with pytest.raises(SnapshotError, match="has no part for rank 2"):
        manager.load_part(path, 2)


def test_a_snapshot_missing_a_part_is_skipped_for_an_older_complete_one(tmp_path):
    manager = SnapshotManager(tmp_path)
    _with_parts(manager, 1)
    newer = _with_parts(manager, 2)
    (tmp_path / "snapshot-000000002.rank-00001.pt").unlink()
    path, body, skipped = manager.load_newest()
    assert path == tmp_path / snapshot_name(1)
    assert body["step"] == 1
    assert skipped == [f"{newer} is incomplete: its part snapshot-000000002.rank-00001.pt is missing."]


def test_a_part_changed_on_disk_is_refused_by_the_rank_that_reads_it(tmp_path):
    manager = SnapshotManager(tmp_path)
    path = _with_parts(manager, 3)
    part = tmp_path / "snapshot-000000003.rank-00000.pt"
    data = bytearray(part.read_bytes())
    data[-30] ^= 0xFF  # the same size: only the hash tells
    part.write_bytes(bytes(data))
    assert manager.verify(path)  # sizes match: each rank hashes the parts it reads, not every part
    with pytest.raises(DamagedSnapshotError, match="part snapshot-000000003.rank-00000.pt changed on disk"):
        manager.load_part(path, 0)
    assert manager.load_part(path, 1)["rank"] == 1


def test_parts_go_with_their_snapshot_when_it_is_pruned_and_orphans_are_removed(tmp_path):
    manager = SnapshotManager(tmp_path, keep_last=1)
    _with_parts(manager, 1)
    _with_parts(manager, 2)  # prunes step 1, its parts included
    # a writer that died after the parts of step 3, before its commit
    manager.save_part({"errors": torch.zeros(1)}, 3, 0)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["snapshot-000000002.json", "snapshot-000000002.pt", "snapshot-000000002.rank-00000.pt",
                     "snapshot-000000002.rank-00001.pt", "snapshot-000000003.rank-00000.pt"]
    assert manager.list() == [tmp_path / snapshot_name(2)]  # a part is never listed as a snapshot
    manager.remove_stale_temporaries()
    assert not (tmp_path / "snapshot-000000003.rank-00000.pt").exists()
    assert (tmp_path / "snapshot-000000002.rank-00001.pt").exists()


def test_a_part_that_cannot_be_written_names_the_rank_and_the_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SnapshotError, match=r"rank 1 cannot write its part .*000000004.rank-00001.pt"):
        SnapshotManager(blocker / "snaps").save_part({"x": torch.zeros(1)}, 4, 1)
