"""``TrainJob`` (what to train), ``run_job`` (one rank), ``launch_job`` (all ranks; bad input a JobError)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ringtrain.exceptions import DataError, JobError, SnapshotError, UnknownWorkloadError
from ringtrain.train.config import TrainerConfig
from ringtrain.train.job import (
    TrainJob,
    build_optimizer,
    check_snapshot_dir,
    input_errors,
    launch_job,
    run_job,
    write_error,
)

QUICK = TrainerConfig(epochs=1, batch_size=32, progress=False, threads=1, seed=3)


@pytest.mark.parametrize(("fields", "needle"), [
    ({"nproc": 0}, "-np 0 must be at least 1. HINT:"),
    ({"subset": 0}, "--subset 0 must be at least 1 item. HINT:"),
    ({"optimizer": "lbfgs"}, "--optimizer 'lbfgs' is not known. HINT: use one of ['sgd', 'adam', 'adamw']"),
    ({"lr": 0.0}, "--lr 0.0 must be a positive number. HINT:"),
    ({"lr": math.inf}, "--lr inf must be a positive number"),
    ({"momentum": -0.1}, "--momentum -0.1 must be a number >= 0. HINT: use e.g. --momentum 0.9"),
    ({"weight_decay": math.nan}, "--weight-decay nan must be a number >= 0"),
    ({"data_dir": "no/such/folder"}, "--data-dir no/such/folder is not a folder. HINT:"),
])
def test_bad_input_is_a_job_error_that_names_the_value(fields, needle):
    with pytest.raises(JobError) as info:
        TrainJob(workload="mnist", **fields)
    assert needle in str(info.value)


def test_json_round_trip_keeps_the_trainer_config(tmp_path):
    job = TrainJob(workload="synthetic", trainer=QUICK.replace(strategy="horovod", warmup_epochs=0.5,
                                                               scale_lr=True),
                   nproc=2, data_dir=str(tmp_path), subset=100, arch="small", optimizer="adamw", lr=0.1,
                   momentum=0.5, weight_decay=0.01, results_json=str(tmp_path / "r.json"))
    text = job.to_json()
    assert json.loads(text)["trainer"]["strategy"] == "horovod"
    assert TrainJob.from_json(text) == job


@pytest.mark.parametrize(("name", "kind"), [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam),
                                            ("adamw", torch.optim.AdamW)])
def test_build_optimizer(name, kind):
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = build_optimizer(name, params, lr=0.5, momentum=0.9, weight_decay=0.01)
    assert type(optimizer) is kind
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (0.5, 0.01)
    if name == "sgd":
        assert group["momentum"] == 0.9


def test_input_errors_are_the_bad_input_types():
    assert set(input_errors()) == {JobError, SnapshotError, DataError, UnknownWorkloadError}


def test_one_rank_trains_in_this_process_and_writes_results(tmp_path, capsys):
    results = tmp_path / "out" / "results.json"
    job = TrainJob(workload="synthetic", trainer=QUICK.replace(max_steps_per_epoch=3), subset=200,
                   results_json=str(results))
    history = run_job(job)
    assert len(history) == 1
    assert history[0].steps == 3
    body = json.loads(results.read_text())
    assert (body["workload"], body["world_size"], body["strategy"]) == ("synthetic", 1, "ddp")
    assert body["epochs"][0]["steps"] == 3
    assert body["resumed_from"] is None
    assert "done: 1 epoch(s)" in capsys.readouterr().out


def test_a_damaged_snapshot_is_refused_before_any_rank_starts(tmp_path):
    (tmp_path / "snapshot-000000004.pt").write_bytes(b"not a snapshot")
    job = TrainJob(workload="synthetic", trainer=QUICK.replace(snapshot_dir=str(tmp_path)))
    with pytest.raises(SnapshotError):
        check_snapshot_dir(job)
    check_snapshot_dir(TrainJob(workload="synthetic",
                                trainer=QUICK.replace(snapshot_dir=str(tmp_path), resume=False)))


def test_write_error_leaves_the_message_where_launch_job_reads_it(tmp_path):
    write_error(tmp_path, 3, "--data-dir x: no MNIST files. HINT: download them")
    assert (tmp_path / "rank-3.txt").read_text() == "--data-dir x: no MNIST files. HINT: download them\n"


@pytest.mark.slow
def test_bad_input_inside_the_ranks_comes_back_as_a_job_error(tmp_path, capfd):
    empty = tmp_path / "empty"
    empty.mkdir()
    job = TrainJob(workload="mnist", trainer=QUICK, nproc=2, data_dir=str(empty))
    with pytest.raises(JobError) as info:
        launch_job(job)
    assert str(empty) in str(info.value)
    assert "HINT:" in str(info.value)
    # told once, by the root-cause report; not by each rank, and the caller need not repeat it
    assert info.value.reported
    captured = capfd.readouterr()
    output = captured.out + captured.err
    first_line = str(info.value).splitlines()[0]
    assert output.count(first_line) == 1, output
    assert f"  error      : {first_line}" in output


def _never_launch(job):
    raise AssertionError("ranks were started")


def _snapshot_of_one_epoch(folder) -> TrainJob:
    job = TrainJob(workload="synthetic", subset=64, trainer=QUICK.replace(
        max_steps_per_epoch=2, save_every=1, snapshot_dir=str(folder)))
    run_job(job)
    return job


def test_a_finished_job_says_so_without_starting_ranks(tmp_path, capsys, monkeypatch):
    from ringtrain.train import job as job_module

    job = _snapshot_of_one_epoch(tmp_path / "snaps")
    capsys.readouterr()
    monkeypatch.setattr(job_module, "_launch", _never_launch)
    results = tmp_path / "results.json"
    again = TrainJob.from_json(job.to_json())
    again = job_module.dataclasses.replace(again, nproc=2, results_json=str(results))
    assert launch_job(again) == 0
    out = capsys.readouterr().out
    assert "snapshot-000000002.pt already holds 1 epoch(s) (--epochs 1): nothing left to train" in out
    assert json.loads(results.read_text())["epochs"] == []


@pytest.mark.parametrize(("changes", "needle"), [
    ({"seed": 9}, "--seed 9 (the snapshot's run: --seed 3"),
    ({"optimizer": "adam"}, "--optimizer adam (the snapshot holds the state of SGD"),
])
def test_a_setting_that_cannot_change_is_refused_before_any_rank_starts(tmp_path, monkeypatch, changes,
                                                                          needle):
    from ringtrain.train import job as job_module

    job = _snapshot_of_one_epoch(tmp_path)
    monkeypatch.setattr(job_module, "_launch", _never_launch)
    trainer = job.trainer.replace(epochs=2, seed=changes.get("seed", job.trainer.seed))
    again = job_module.dataclasses.replace(job, nproc=2, trainer=trainer, optimizer=changes.get("optimizer"))
    with pytest.raises(SnapshotError) as info:
        launch_job(again)
    assert needle in str(info.value)
    assert "HINT: resume with" in str(info.value)


def test_momentum_without_sgd_is_refused(monkeypatch):
    from ringtrain.train import job as job_module

    monkeypatch.setattr(job_module, "_launch", _never_launch)
    with pytest.raises(JobError, match=r"--momentum 0.5 has no effect on the adam optimizer \(--optimizer "
                                       r"adam, mnist's default\)"):
        launch_job(TrainJob(workload="mnist", momentum=0.5, nproc=2))
    with pytest.raises(JobError, match="HINT: add --optimizer sgd, or drop --momentum"):
        launch_job(TrainJob(workload="synthetic", optimizer="adamw", momentum=0.5, nproc=2))


def _refuse(constant: str) -> None:
    raise ValueError(f"bare {constant} in the results: not standard JSON")


def test_results_json_is_standard_json_with_null_for_what_was_not_measured(tmp_path):
    # a regression has no accuracy: it was written as a bare NaN, which strict JSON readers refuse
    results = tmp_path / "results.json"
    job = TrainJob(workload="synthetic-ratings", trainer=QUICK.replace(max_steps_per_epoch=2), subset=300,
                   results_json=str(results))
    run_job(job)
    body = json.loads(results.read_text(), parse_constant=_refuse)
    (epoch,) = body["epochs"]
    assert epoch["accuracy"] is None
    assert isinstance(epoch["rmse"], float)
    assert not list(tmp_path.glob(".*.tmp"))


def test_like_gives_synthetic_images_the_sizes_of_a_real_data_set(tmp_path):
    results = tmp_path / "results.json"
    job = TrainJob(workload="synthetic", like="mnist", trainer=QUICK.replace(max_steps_per_epoch=2),
                   subset=64, results_json=str(results))
    assert TrainJob.from_json(job.to_json()) == job
    run_job(job)  # the default model takes the 1x28x28 images
    assert json.loads(results.read_text())["epochs"][0]["steps"] == 2
    with pytest.raises(JobError, match="--like mnist shapes synthetic images"):
        TrainJob(workload="mnist", like="mnist")


@pytest.mark.parametrize("writer", ["results", "error"])
def test_files_read_by_others_are_never_left_half_written(writer, tmp_path, monkeypatch):
    from pathlib import Path

    from ringtrain.train import job as job_module

    def half_then_fail(self, text, *args, **kwargs):
        with open(self, "w") as fp:
            fp.write(text[: len(text) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(OSError, match="No space"):
        if writer == "results":
            job_module.write_json_atomically(tmp_path / "results.json", {"epochs": [1, 2, 3]})
        else:
            write_error(tmp_path, 1, "--data-dir x: no MNIST files. HINT: download them")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("fields", "needle"), [
    ({"min_np": 1, "max_np": 2, "trainer": QUICK.replace(strategy="horovod")},
     "--ray cannot be combined with --min-np/--max-np/--host-discovery-script"),
    ({"node_launch": {"nnodes": (2, 2), "num_proc": 2}}, "--ray cannot be combined with --nnodes"),
    ({"max_restarts": 1}, "--max-restarts 1 with --ray needs --snapshot-dir"),
])
def test_a_ray_job_refuses_what_ray_cannot_do_here(fields, needle):
    with pytest.raises(JobError) as info:
        TrainJob(workload="mnist", nproc=2, ray="auto", **{"trainer": QUICK, **fields})
    assert needle in str(info.value)
    assert "HINT:" in str(info.value)


def test_a_ray_job_travels_in_the_ranks_command_not_in_a_file_of_this_machine(monkeypatch):
    """Ranks on other Ray nodes cannot read the launcher's temp folder: the job is in their command."""
    from ringtrain.launch.ray import driver as ray_driver

    seen = []
    monkeypatch.setattr(ray_driver, "launch_on_ray", lambda config, environ=None: seen.append(config) or 0)
    job = TrainJob(workload="mnist", trainer=QUICK.replace(threads=2), nproc=2, subset=64,
                   ray="10.0.0.1:6379", node_launch={"num_proc": 2, "nproc_per_node": 1})
    assert launch_job(job) == 0
    (config,) = seen
    assert (config.ray, config.num_proc, config.nproc_per_node) == ("10.0.0.1:6379", 2, 1)
    assert config.ray_cpus_per_rank == 2.0  # each rank's --threads reserved on its node
    command = list(config.command)
    assert command[1:3] == ["-m", "ringtrain.train.worker"]
    assert "--job" not in command
    assert TrainJob.from_json(command[command.index("--job-json") + 1]) == job
