"""Checks the launcher makes before any rank starts: device, timeline file, threads against cores."""

from __future__ import annotations

import os

import pytest
import torch

from ringtrain.exceptions import UsageError
from ringtrain.launch import prechecks
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.prechecks import (
    before_launch,
    check_device,
    on_this_machine,
    oversubscription_warning,
    timeline_problem,
    timeline_setting,
)

COMMAND = ("python", "-c", "pass")


def test_cuda_without_a_gpu_is_refused_with_the_value_and_the_fix(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError) as info:
        check_device("cuda")
    message = str(info.value)
    assert message.startswith("--device cuda: no CUDA device here (")
    assert "HINT: use --device cpu" in message


def test_cuda_with_a_gpu_and_cpu_pass(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_device("cuda")
    check_device("cpu")
    check_device(None)


@pytest.mark.parametrize(("value", "expected"), [
    ("/nonexistent/t.json", "the folder /nonexistent does not exist. HINT: create it (mkdir -p"),
    ("{tmp}/", "names a folder, not a file"),
    ("{tmp}", "names a folder, not a file"),
])
def test_a_timeline_rank_0_cannot_write_is_named_with_its_source(value, expected, tmp_path):
    value = value.replace("{tmp}", str(tmp_path))
    problem = timeline_problem(value, f"HOROVOD_TIMELINE={value}")
    assert problem is not None
    assert problem.startswith(f"HOROVOD_TIMELINE={value}")
    assert expected in problem
    assert "HINT:" in problem


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert "is not writable" in timeline_problem(str(folder / "t.json"), "x")
    finally:
        folder.chmod(0o700)


@pytest.mark.parametrize("value", ["", "DYNAMIC", "timeline.json", "{tmp}/t.json"])
def test_a_writable_timeline_passes(value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert timeline_problem(value.replace("{tmp}", str(tmp_path)), "x") is None


def test_the_timeline_setting_follows_the_workers_precedence():
    environ = {"HOROVOD_TIMELINE": "/env/t.json"}
    assert timeline_setting(LaunchConfig(command=COMMAND), {}) is None
    assert timeline_setting(LaunchConfig(command=COMMAND), environ) == ("/env/t.json",
                                                                        "HOROVOD_TIMELINE=/env/t.json")
    flag = LaunchConfig(command=COMMAND, tuning={"HOROVOD_TIMELINE": "/flag/t.json"})
    assert timeline_setting(flag, environ) == ("/flag/t.json", "--timeline-filename /flag/t.json")
    exported = LaunchConfig(command=COMMAND, tuning={"HOROVOD_TIMELINE": "/flag/t.json"},
                            exports={"HOROVOD_TIMELINE": "/x/t.json"})
    assert timeline_setting(exported, environ) == ("/x/t.json", "-x HOROVOD_TIMELINE=/x/t.json")


def test_before_launch_refuses_the_timeline_of_a_local_job():
    config = LaunchConfig(command=COMMAND, num_proc=2)
    with pytest.raises(UsageError, match="folder /nonexistent does not exist"):
        before_launch(config, {"HOROVOD_TIMELINE": "/nonexistent/t.json"}, oversubscribe=True)


def test_a_job_on_other_hosts_is_not_checked_here():
    config = LaunchConfig(command=COMMAND, num_proc=2, hosts=(HostSlots("far", 2),))
    assert on_this_machine(config, {}) is None
    assert before_launch(config, {"HOROVOD_TIMELINE": "/nonexistent/t.json"}) == []


def test_the_ranks_here_come_from_the_plan():
    assert on_this_machine(LaunchConfig(command=COMMAND, num_proc=3), {}).ranks == 3
    assert on_this_machine(LaunchConfig(command=COMMAND, nproc_per_node=4, standalone=True), {}).ranks == 4
    elastic = on_this_machine(LaunchConfig(command=COMMAND, num_proc=2, min_np=1), {})
    assert (elastic.ranks, elastic.has_rank_0) == (2, True)


@pytest.mark.parametrize(("ranks", "threads", "cores", "expected"), [
    (3, 1, 2, "3 ranks x 1 thread each = 3 threads on 2 cores"),
    (2, 4, 4, "2 ranks x 4 threads each = 8 threads on 4 cores"),
])
def test_more_threads_than_cores_is_a_warning_naming_the_figures(ranks, threads, cores, expected):
    warning = oversubscription_warning(ranks, threads, cores, "--oversubscribe")
    assert warning is not None
    assert expected in warning
    assert "--oversubscribe silences this warning" in warning


@pytest.mark.parametrize(("ranks", "threads", "cores"), [(2, 1, 2), (1, 8, 2), (4, 1, 16)])
def test_enough_cores_is_no_warning(ranks, threads, cores):
    assert oversubscription_warning(ranks, threads, cores, "x") is None


def test_before_launch_warns_once_unless_silenced(monkeypatch):
    monkeypatch.setattr(prechecks, "usable_cores", lambda: 2)
    config = LaunchConfig(command=COMMAND, num_proc=3)
    (warning,) = before_launch(config, {})
    assert "3 ranks x 1 thread each = 3 threads on 2 cores" in warning
    assert before_launch(config, {}, oversubscribe=True) == []
    # OMP_NUM_THREADS given to the workers counts: 2 ranks x 2 threads on 2 cores
    (warning,) = before_launch(LaunchConfig(command=COMMAND, num_proc=2), {"OMP_NUM_THREADS": "2"})
    assert "= 4 threads on 2 cores" in warning
