"""``ringtrain env``: text and JSON reports, run in-process with a patched environment."""

from __future__ import annotations

import json
import os

import pytest

from ringtrain.cli.main import main

SLURM_BATCH = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train.sh", "SLURM_NTASKS": "4",
               "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "0"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "777", "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[1-2]"}


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch):
    """Replace the whole process environment (PATH kept) with the given variables."""
    def apply(variables: dict[str, str]) -> None:
        for key in list(os.environ):
            if key != "PATH":
                monkeypatch.delenv(key)
        for key, value in variables.items():
            monkeypatch.setenv(key, value)
    return apply


def test_text_report(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ(OMPI)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("environment: openmpi (OpenMpiEnvironment)\n")
    assert "also matched (lower priority): slurm-shell" in out
    assert "  OMPI_COMM_WORLD_RANK=1\n" in out
    for line in ("rank              1", "world size        4", "local rank        1", "local world size  2",
                 "node rank         0", "nodes             2", "main address      node1",
                 "main port         15777"):
        assert f"  {line}\n" in out
    assert "warnings:" not in out


def test_json_report(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ(OMPI)
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["environment"] == "openmpi"
    assert data["variables"]["OMPI_COMM_WORLD_SIZE"] == "4"
    assert data["placement"]["rank"] == 1
    assert data["placement"]["main_address"] == "node1"
    assert data["warnings"] == []
    assert data["error"] is None


def test_warnings_are_shown(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ(SLURM_BATCH)
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "environment: slurm-shell" in out
    assert "world size        1" in out
    assert "warnings:\n  - slurm: the job has SLURM_NTASKS=4 but this process was not started by srun" in out


def test_unusable_environment_exits_1_with_the_reason(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ({"PMI_RANK": "0", "PMI_SIZE": "four"})
    assert main(["env", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["placement"] is None
    assert "PMI_SIZE='four'" in data["error"]
    assert main(["env"]) == 1
    out = capsys.readouterr().out
    assert "placement: unavailable: PMI_SIZE='four' is not an integer. HINT: set PMI_SIZE" in out
    assert "warnings:" not in out  # the error is not repeated as a warning


def test_no_launcher(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ({})
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["environment"], data["placement"]["world_size"], data["variables"]) == ("single", 1, {})


def test_kubeflow_trainer_pod_tells_what_ringtrain_run_reads(environ,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    environ({"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
             "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500",
             "RINGTRAIN_MAX_RESTARTS": "1"})
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("environment: kubeflow-trainer (TrainerV2Environment)\n")
    assert "ringtrain run here would use:\n" in out
    for line in ("--nnodes 2 (from PET_NNODES)", "--node-rank 1 (from PET_NODE_RANK)",
                 "--master-addr job-node-0-0.job (from PET_MASTER_ADDR)",
                 "--max-restarts 1 (from RINGTRAIN_MAX_RESTARTS)"):
        assert f"  {line}\n" in out
    assert "ringtrain run python train.py" in out  # two processes per pod: the warning says how to start them


def test_bad_pet_value_is_reported_not_raised(environ, capsys: pytest.CaptureFixture[str]) -> None:
    environ({"PET_NNODES": "2", "PET_NODE_RANK": "one", "PET_STANDALONE": "maybe"})
    main(["env", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert any("PET_NODE_RANK='one'" in line for line in data["ringtrain_run"]), data["ringtrain_run"]
