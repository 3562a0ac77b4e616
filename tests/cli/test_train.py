"""``ringtrain train``: bad input exits 2 with a message (also from inside ranks); a 2-rank run killed
mid-epoch resumes from its last snapshot (-np 2 end to end: the README's quick start, test_repository.py)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtrain.cli.main import main

QUICK = ["--subset", "200", "--epochs", "1", "--no-progress", "--threads", "1"]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _ringtrain(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtrain.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize(("argv", "message"), [
    (["--save-every", "0"], "--save-every 0"),
    (["--data-dir", "no/such/folder"], "--data-dir no/such/folder"),
    (["-np", "0"], "-np 0"),
    (["-np", "2", "--subset", "0"], "--subset 0"),
    (["--lr", "-1"], "--lr -1"),
    (["--warmup-epochs", "2"], "without --scale-lr: "),
    (["--batches-per-allreduce", "0"], "--batches-per-allreduce 0 must be"),
    (["--keep-last", "0"], "--keep-last 0 must be"),
    # the command line's words, not the Python API's (epochs=3)
    (["--epochs", "-1"], "--epochs -1 must be a whole number of at least 1. HINT: use e.g. --epochs 3."),
    (["--max-steps-per-epoch", "0"], "or no --max-steps-per-epoch for whole epochs"),
    (["--like", "cifar10"], "--like cifar10 shapes synthetic images"),
    (["--max-restarts", "-1"], "--max-restarts -1"),
    # every numeric flag the Trainer or the job checks: its flag and value, and the fix as a flag
    (["--batch-size", "0"], "--batch-size 0 must be a whole number of at least 1. HINT: use e.g. --batch"),
    (["--eval-every", "0"], "HINT: use e.g. --eval-every 1."),
    (["--save-every-steps", "0"], "--save-every-steps 0 must be"),
    (["--threads", "0"], "--threads 0 must be a whole number of at least 1, or left out."),
    (["--num-workers", "-1"], "--num-workers -1 must be 0 or more. HINT: use --num-workers 0"),
    (["--seed", "-1"], "--seed -1 must be a whole number >= 0. HINT: use e.g. --seed 0."),
    (["--warmup-epochs", "-1", "--scale-lr"], "HINT: use e.g. --warmup-epochs 5"),
    (["--momentum", "-1"], "--momentum -1 must be a number >= 0. HINT: use e.g. --momentum 0.9, or"),
    (["--weight-decay", "-1"], "HINT: use e.g. --weight-decay 0.0001, or --weight-decay 0 for none."),
    (["--min-np", "0"], "--min-np 0 is not a range of worker counts"),
    (["--min-np", "1", "--strategy", "ddp"], "needs --strategy horovod, not --strategy ddp"),
    (["--signals-to-handle", "SIGTERM,SIGKILL"], "--signals-to-handle SIGTERM,SIGKILL: 'SIGKILL' is not"),
    (["--max-restarts", "2", "--no-resume"], "--no-resume with --max-restarts"),
    (["--compression", "zstd"], "--compression zstd is not known. HINT: use one of none, fp16, bf16"),
    (["--compression", "powersgd:0"], "--compression powersgd:0: PowerSGD's rank must be a whole number"),
    (["--compression", "bf16", "--fp16-allreduce"], "--fp16-allreduce and --compression bf16 both say"),
    (["--sync-every", "0"], "--sync-every 0 must be a whole number of at least 1"),
    (["--outer-lr", "0.7"], "apply only to Local SGD's averaging. HINT: set e.g. --sync-every 8"),
    (["--sync-every", "8", "--outer-momentum", "1"], "--outer-momentum 1.0 must be a number from 0"),
    (["--sync-every", "8", "--compression", "powersgd"], "--sync-every 8 with --compression powersgd"),
    (["--shard-optimizer", "--sync-every", "4"], "--shard-optimizer with --sync-every 4"),
])
def test_bad_flags_exit_2_with_a_hint(capsys, argv, message):
    assert main(["train", "mnist", *QUICK, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "HINT" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    # field=value is the Python API's spelling (">= 0" is not)
    assert not re.search(r"\w=", err.partition("HINT")[0].split(":", 2)[-1]), f"an API field: {err}"
    assert "None" not in err, f"Python's None in a CLI message: {err}"
    assert "_" not in err, f"an API field name in a CLI message: {err}"


def test_config_messages_are_told_in_flags() -> None:
    from ringtrain.cli.train import as_flags

    flags = frozenset({"--epochs", "--scale-lr", "--snapshot-dir", "--threads"})
    assert as_flags("epochs=-1 must be. HINT: use e.g. epochs=3.", flags) == \
        "--epochs -1 must be. HINT: use e.g. --epochs 3."
    assert as_flags("no effect without scale_lr=True: set scale_lr=True, or", flags) == \
        "no effect without --scale-lr: set --scale-lr, or"
    assert as_flags("HINT: pass snapshot_dir='snapshots' (any folder).", flags) == \
        "HINT: pass --snapshot-dir snapshots (any folder)."
    assert as_flags("threads=0 must be at least 1 or None. HINT: or threads=None to", flags) == \
        "--threads 0 must be at least 1, or left out. HINT: or no --threads to"
    # a hint that named the flag in brackets names it once
    assert as_flags("HINT: pass strategy='horovod' (--strategy horovod).", flags | {"--strategy"}) == \
        "HINT: pass --strategy horovod."
    # a field without a flag of its name stays as the API writes it
    assert as_flags("num_workers=-1 must be 0 or more", flags) == "num_workers=-1 must be 0 or more"


def test_unknown_workload_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "imagenet"])
    assert info.value.code == 2
    assert "imagenet" in capsys.readouterr().err


def test_wrong_file_format_exits_2(tmp_path, capsys):
    folder = tmp_path / "mnist"
    folder.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (folder / name).write_bytes(b"this is not an IDX file")
    assert main(["train", "mnist", *QUICK, "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "HINT" in err
    assert "Traceback" not in err


def test_corrupt_snapshot_exits_2_before_training(tmp_path, capsys):
    (tmp_path / "snapshot-000000004.pt").write_bytes(b"\x00" * 100)
    assert main(["train", "mnist", *QUICK, "--snapshot-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "snapshot-000000004.pt" in err
    assert "HINT: delete" in err


@pytest.mark.slow
def test_a_bit_flip_in_the_latest_snapshot_is_detected_and_the_newest_good_one_resumed(tmp_path, capsys):
    snaps, results = tmp_path / "snaps", tmp_path / "results.json"
    run = ["train", "mnist", "--subset", "200", "--no-progress", "--threads", "1", "--save-every", "1",
           "--snapshot-dir", str(snaps), "--results-json", str(results)]
    assert main([*run, "--epochs", "2"]) == 0
    first = json.loads(results.read_text())
    steps_per_epoch = first["epochs"][0]["steps"]
    snapshots = sorted(snaps.glob("snapshot-*.pt"))
    assert len(snapshots) == 2
    latest = snapshots[-1]
    data = bytearray(latest.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(b ^ 0xFF for b in data[middle:middle + 4096])  # 4 KiB flipped
    latest.write_bytes(bytes(data))
    capsys.readouterr()

    assert main([*run, "--epochs", "3"]) == 0
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert f"{latest} is damaged: its SHA-256" in output
    assert "skipped, resuming from an older snapshot" in output
    assert f"resumed from {snapshots[0]}" in output
    body = json.loads(results.read_text())
    assert body["resumed_from"] == str(snapshots[0])
    assert [e["epoch"] for e in body["epochs"]] == [2, 3]  # epoch 2 is trained again, then 3
    assert body["epochs"][-1]["steps"] == 3 * steps_per_epoch


@pytest.mark.parametrize("kind", ["file", "proc"])
def test_an_unusable_snapshot_dir_exits_2_before_training(tmp_path, capsys, kind):
    folder = tmp_path / "snaps"
    if kind == "file":
        folder.write_text("not a folder")
    else:
        folder = Path("/proc/ringtrain-snapshots")
    assert main(["train", "mnist", *QUICK, "--save-every", "1", "--snapshot-dir", str(folder)]) == 2
    captured = capsys.readouterr()
    assert str(folder) in captured.err
    assert "HINT: point --snapshot-dir" in captured.err
    assert "Traceback" not in captured.err
    assert "epoch 1/1" not in captured.out  # refused before any training


def test_one_process_trains_and_snapshots(tmp_path, capsys):
    results = tmp_path / "results.json"
    code = main(["train", "synthetic", *QUICK, "--snapshot-dir", str(tmp_path / "snaps"),
                 "--results-json", str(results)])
    assert code == 0
    out = capsys.readouterr().out
    assert "epoch 1/1" in out
    assert "samples/s" in out
    assert "snapshot" in out
    body = json.loads(results.read_text())
    assert body["world_size"] == 1
    assert len(body["epochs"]) == 1
    assert list((tmp_path / "snaps").glob("snapshot-*.pt"))


def test_a_resumed_run_applies_a_new_lr_and_a_finished_one_starts_no_rank(tmp_path, capsys):
    run = ["train", "mnist", "--subset", "100", "--no-progress", "--threads", "1", "--save-every", "1",
           "--snapshot-dir", str(tmp_path / "snaps"), "--max-steps-per-epoch", "2"]
    assert main([*run, "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main([*run, "--epochs", "2", "--lr", "0.01"]) == 0
    out = capsys.readouterr().out
    assert ", lr 0.01, " in out  # the header shows the rate that trains, not the snapshot's 0.001
    assert "changed since the snapshot, applied: --epochs 1 -> 2, --lr 0.001 -> 0.01" in out
    assert "epoch 2/2" in out
    assert main([*run, "--epochs", "2", "-np", "2"]) == 0
    captured = capsys.readouterr()
    assert "already holds 2 epoch(s) (--epochs 2): nothing left to train" in captured.out
    assert "[0]" not in captured.out + captured.err  # said by the launcher: no rank was started
    assert main([*run, "--epochs", "3", "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "--seed 1 (the snapshot's run: --seed 0" in err
    assert "HINT: resume with --seed 0" in err


# -np 2 end to end (epoch lines, --results-json, --log-dir's metrics.csv) is checked on the run of the
# README's quick start, `ringtrain train mnist -np 2` too, so that the suite starts that job once:
# tests/test_repository.py::test_the_quick_start_prints_the_accuracy_the_readme_quotes


@pytest.mark.slow
def test_error_inside_a_rank_exits_2(tmp_path):
    # files with the right names but not IDX data: the launcher finds them (a folder without the files is
    # refused before any rank starts, test_train_checks.py), every rank then fails to read them
    (tmp_path / "mnist").mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (tmp_path / "mnist" / name).write_bytes(b"not an IDX file")
    proc = _ringtrain("train", "mnist", "-np", "2", "--data-dir", str(tmp_path), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert "ringtrain train: error:" in proc.stderr
    assert "HINT" in proc.stderr
    # told once, in the root-cause report: not by each rank, not again at the end
    assert (proc.stdout + proc.stderr).count("is not an IDX file") == 1, proc.stderr
    assert f"  error      : {tmp_path / 'mnist'}" in proc.stderr


# A 2-rank run SIGKILLed mid-epoch resumes from its last snapshot: checked in the job that
# tests/train/test_preemption.py::test_a_kill_and_signals_mid_epoch_each_resume_with_the_same_command
# also stops with signals (the same command line), so that the suite starts that job once.


@pytest.mark.slow
@pytest.mark.parametrize(("nproc", "to_group"), [(1, False), (2, False), (2, True)])
def test_ctrl_c_says_which_snapshot_was_written_last_and_that_the_same_command_resumes(nproc, to_group,
                                                                                     tmp_path):
    """SIGINT to the launcher (``kill -INT``), or to its whole process group (Ctrl-C on a terminal)."""
    snaps = tmp_path / "snaps"
    # short epochs (256 items: 4 or 8 steps), so that the first epoch's snapshot comes soon; many of
    # them, so that the run is still training when the signal comes
    argv = [sys.executable, "-m", "ringtrain.cli.main", "train", "mnist", "-np", str(nproc),
            "--subset", "256", "--epochs", "1000", "--batch-size", "32", "--save-every", "1",
            "--snapshot-dir", str(snaps), "--no-progress", "--threads", "1"]
    # pytest started as a shell's background job ignores SIGINT, and an ignored signal stays ignored
    # across exec: the one-process run would never see the Ctrl-C (and train on until the timeout).
    # A handled one is reset to its default by exec, so handle it here while the run starts.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, inherited)
    try:
        deadline = time.monotonic() + 300
        while not list(snaps.glob("snapshot-*.pt")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no snapshot appeared"
            time.sleep(0.05)
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    latest = max(snaps.glob("snapshot-*.pt"))
    assert f"ringtrain train: stopped (SIGINT). Last snapshot: {latest} (after optimizer step " \
           f"{int(latest.stem.split('-')[1])}, written" in err
    assert "Run the same command again to resume from it." in err
    assert "Traceback" not in err
    assert "Root cause" not in err  # a stop is not a failure


def test_stopped_message_without_snapshots(tmp_path):
    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.job import TrainJob, stopped_message

    none = TrainJob(workload="mnist", trainer=TrainerConfig())
    assert "HINT: add --save-every 1" in stopped_message(none)
    empty = TrainJob(workload="mnist", trainer=TrainerConfig(snapshot_dir=str(tmp_path), save_every=2))
    assert "No snapshot was written yet" in stopped_message(empty)
    assert "end of epoch 2" in stopped_message(empty)
    (tmp_path / "snapshot-000000007.pt").write_bytes(b"x")
    fresh = TrainJob(workload="mnist", trainer=TrainerConfig(snapshot_dir=str(tmp_path), save_every=2,
                                                             resume=False))
    assert "without --no-resume" in stopped_message(fresh, "SIGTERM")
    assert "stopped (SIGTERM)" in stopped_message(fresh, "SIGTERM")


def test_the_flags_are_frozen_and_every_long_flag_has_a_snake_case_spelling():
    import argparse

    from ringtrain.cli import train

    parser = argparse.ArgumentParser()
    train.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    flags = {s for a in sub._actions for s in a.option_strings}
    dashed = {f for f in flags if "_" not in f}
    assert dashed == {
        "-h", "--help", "-np", "--num-proc", "--epochs", "--batch-size", "--lr", "--optimizer", "--momentum",
        "--weight-decay", "--arch", "--strategy", "--fp16-allreduce", "--batches-per-allreduce", "--amp",
        "--compression", "--sync-every", "--outer-lr", "--outer-momentum", "--shard-optimizer",
        "--scale-lr", "--warmup-epochs", "--seed", "--eval-every", "--max-steps-per-epoch", "--device",
        "--threads", "--num-workers", "--data-dir", "--download", "--cache-dir", "--subset", "--like",
        "--save-every",
        "--save-every-steps", "--snapshot-dir", "--keep-last", "--sync-snapshots", "--no-resume", "--log-dir",
        "--results-json",
        "--no-progress", "--max-restarts", "--hang-timeout", "--no-watch",
        "--min-np", "--max-np", "--host-discovery-script",
        "--oversubscribe",
        "--signals-to-handle", "--ray",
        # torchrun's node flags, shared with ringtrain run (they read PET_* too)
        "--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
        "--standalone", "--master-addr", "--master-port", "--local-addr", "--rdzv-conf",
    }
    for flag in dashed:
        if flag.startswith("--") and "-" in flag[2:]:
            assert "--" + flag[2:].replace("-", "_") in flags, flag


@pytest.mark.parametrize(("argv", "message"), [
    (["--ray", "headnode"], "--ray 'headnode' is not a Ray address"),
    (["--ray", "auto", "--nnodes", "2"], "--ray cannot be combined with --nnodes"),
    (["--ray", "auto", "--min-np", "1", "--strategy", "horovod"],
     "elastic jobs on Ray are not supported yet"),
])
def test_ray_flags_that_cannot_work_exit_2_with_a_hint(capsys, argv, message):
    pytest.importorskip("ray", reason="the ray extra is not installed")
    assert main(["train", "mnist", "-np", "2", *QUICK, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "HINT" in err


def test_a_rank_refuses_ray_on_its_command_line(capsys, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert main(["train", "mnist", *QUICK, "--ray", "auto"]) == 2
    assert "--ray: this ringtrain train is a rank that a launcher started" in capsys.readouterr().err


def test_hang_timeout_and_no_watch_reach_the_launcher(monkeypatch, tmp_path):
    from ringtrain.launch import entry

    seen = []
    monkeypatch.setattr(entry, "launch", lambda config: seen.append(config) or 0)
    assert main(["train", "synthetic", "-np", "2", "--epochs", "1", "--max-steps-per-epoch", "1",
                 "--hang-timeout", "90", "--no-watch"]) == 0
    assert (seen[0].hang_timeout, seen[0].watch) == (90.0, False)
