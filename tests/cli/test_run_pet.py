"""``ringtrain run`` reads torchrun's ``PET_*`` defaults as torchrun does, says where each value came from,
and completes them from a Kubernetes operator's pod (ringtrain.launch.plan)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from unittest import mock

import pytest

from ringtrain.cli.main import main
from ringtrain.cli.options import value_source
from ringtrain.cli.run import add_run_arguments, config_from_args, describe_sources
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.plan import HostsPlan, NodePlan, resolve_plan

TRAINER_V2 = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "3", "PET_NODE_RANK": "1",
              "PET_MASTER_ADDR": "mnist-node-0-0.mnist", "PET_MASTER_PORT": "29500"}
PYTORCHJOB_OLD = {"RANK": "1", "WORLD_SIZE": "4", "PET_NNODES": "2", "MASTER_ADDR": "job-master-0",
                  "MASTER_PORT": "23456"}
PYTORCHJOB_ELASTIC = {"PET_NNODES": "1:3", "PET_RDZV_BACKEND": "c10d",
                      "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_ID": "job",
                      "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3"}
TRAINER_MAIN = "mnist-node-0-0.mnist:29500"
JOBSET = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "js-workers-0-0.js", "MASTER_PORT": "29400",
          "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2"}


def exit_code(argv: list[str]) -> int:
    """``main(argv)``'s exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def parsed(argv: list[str]) -> argparse.Namespace:
    """Parse ``ringtrain run`` flags against the (patched) process environment."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args([*argv, "python", "train.py"])


def plan_for(variables: dict[str, str], *argv: str) -> NodePlan | HostsPlan:
    with mock.patch.dict(os.environ, variables, clear=True):
        plan = resolve_plan(config_from_args(parsed(list(argv))), dict(os.environ))
    assert isinstance(plan, (NodePlan, HostsPlan))
    return plan


@pytest.mark.parametrize(("variables", "argv", "expected"), [
    # (nproc, node rank, min nodes, max nodes, backend, endpoint)
    (TRAINER_V2, [], (3, 1, 2, 2, "static", TRAINER_MAIN)),
    (PYTORCHJOB_OLD, [], (2, 1, 2, 2, "static", "job-master-0:23456")),
    ({**PYTORCHJOB_OLD, "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "job-master-0",
      "PET_MASTER_PORT": "23456"}, [], (2, 1, 2, 2, "static", "job-master-0:23456")),
    (PYTORCHJOB_ELASTIC, [], (2, 0, 1, 3, "c10d", "job-worker-0:23456")),
    (JOBSET, [], (2, 1, 2, 2, "static", "js-workers-0-0.js:29400")),
    # explicit flags win over PET_* and over the pod's own variables
    (TRAINER_V2, ["--nproc-per-node", "1", "--node-rank", "0"], (1, 0, 2, 2, "static", TRAINER_MAIN)),
    (PYTORCHJOB_OLD, ["--node-rank", "0", "--master-addr", "elsewhere"],
     (2, 0, 2, 2, "static", "elsewhere:23456")),
    # RINGTRAIN_<FLAG> wins over PET_<FLAG>
    ({**TRAINER_V2, "RINGTRAIN_NPROC_PER_NODE": "4"}, [], (4, 1, 2, 2, "static", TRAINER_MAIN)),
])
def test_pods_plan_without_flags(variables: dict[str, str], argv: list[str], expected: tuple) -> None:
    plan = plan_for(variables, *argv)
    assert isinstance(plan, NodePlan)
    assert (plan.nproc, plan.node_rank, plan.min_nodes, plan.max_nodes, plan.rdzv_backend,
            plan.rdzv_endpoint) == expected


def test_every_torchrun_flag_reads_its_pet_variable() -> None:
    variables = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
                 "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "h:1", "PET_RDZV_ID": "j",
                 "PET_STANDALONE": "0", "PET_MAX_RESTARTS": "2",
                 "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "5", "PET_MODULE": "1", "PET_NO_PYTHON": "0",
                 "PET_RUN_PATH": "0", "PET_LOG_DIR": "logs", "PET_REDIRECTS": "3", "PET_TEE": "1",
                 "PET_LOCAL_ADDR": "a", "PET_RDZV_CONF": "timeout=5"}
    with mock.patch.dict(os.environ, variables, clear=True):
        args = parsed([])
    got = {name: getattr(args, name[4:].lower()) for name in variables}
    assert got == {**variables, "PET_STANDALONE": False, "PET_MODULE": True, "PET_NO_PYTHON": False,
                   "PET_RUN_PATH": False, "PET_NODE_RANK": 1, "PET_MAX_RESTARTS": 2, "PET_MASTER_PORT": 5}
    assert {value_source(args, name[4:].lower()) for name in variables} == set(variables)


def test_sources_are_told() -> None:
    with mock.patch.dict(os.environ, {**TRAINER_V2, "RINGTRAIN_MASTER_PORT": "1234"}, clear=True):
        args = parsed(["--nnodes", "2"])
    assert value_source(args, "nnodes") == "command line"
    assert value_source(args, "node_rank") == "PET_NODE_RANK"
    assert value_source(args, "master_port") == "RINGTRAIN_MASTER_PORT"
    assert value_source(args, "rdzv_id") == "default"
    lines = describe_sources(args)
    assert "--nnodes 2 (from command line)" in lines
    assert "--node-rank 1 (from PET_NODE_RANK)" in lines


def test_node_rank_0_is_told_too() -> None:
    variables = {**TRAINER_V2, "PET_NODE_RANK": "0", "PET_MAX_RESTARTS": "0"}
    with mock.patch.dict(os.environ, variables, clear=True):
        lines = describe_sources(parsed([]))
    assert "--node-rank 0 (from PET_NODE_RANK)" in lines
    assert "--max-restarts 0 (from PET_MAX_RESTARTS)" in lines


def test_empty_pet_switch_is_on_as_the_training_operator_means_it() -> None:
    with mock.patch.dict(os.environ, {"PET_STANDALONE": ""}, clear=True):
        assert parsed([]).standalone is True
    with mock.patch.dict(os.environ, {"RINGTRAIN_STANDALONE": ""}, clear=True):
        assert not parsed([]).standalone


def test_horovodrun_flags_take_no_pet_variable() -> None:
    with mock.patch.dict(os.environ, {"PET_NUM_PROC": "4", "PET_NO_HOROVOD_SHIM": "1"}, clear=True):
        args = parsed([])
    assert args.num_proc is None
    assert args.no_horovod_shim is None


def test_mpijob_launcher_runs_on_the_hostfiles_workers(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job.ns.svc slots=2\njob-worker-1.job.ns.svc slots=2\n")
    plan = plan_for({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(hostfile)})
    workers = (HostSlots("job-worker-0.job.ns.svc", 2), HostSlots("job-worker-1.job.ns.svc", 2))
    assert plan == HostsPlan(workers, 4, "OMPI_MCA_orte_default_hostfile")


@pytest.mark.parametrize(("variables", "argv", "message"), [
    ({**TRAINER_V2, "PET_NNODES": "two"}, [], "PET_NNODES='two' is not N or MIN:MAX"),
    ({**TRAINER_V2, "PET_NNODES": "3:1"}, [], "PET_NNODES='3:1' is not N or MIN:MAX"),
    ({**TRAINER_V2, "PET_NODE_RANK": "x"}, [], "PET_NODE_RANK='x' is not valid"),
    ({**TRAINER_V2, "PET_NODE_RANK": "2"}, [], "PET_NODE_RANK=2 is not below PET_NNODES=2"),
    ({**TRAINER_V2, "PET_STANDALONE": "maybe"}, [], "PET_STANDALONE='maybe' is not a boolean"),
    ({**TRAINER_V2}, ["--nnodes", "x"], "--nnodes 'x' is not N or MIN:MAX"),
    ({**PYTORCHJOB_OLD, "RANK": "5"}, [], "RANK=5 is beyond WORLD_SIZE=4"),
    ({**PYTORCHJOB_OLD, "RANK": "3", "WORLD_SIZE": "8"}, [], "RANK=3 is not below the 2 nodes"),
    ({**JOBSET, "PET_NNODES": ""}, [], "PET_NNODES='' is neither a number of nodes nor MIN:MAX"),
])
def test_bad_values_name_the_variable_and_exit_2(variables: dict[str, str], argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with mock.patch.dict(os.environ, {**variables, "PATH": os.environ.get("PATH", "")}, clear=True):
        code = exit_code(["run", *argv, "--no-horovod-shim", "python", "-c", "pass"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_hostfile_without_a_usable_line_names_the_file(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the operator has not written the workers yet\n")
    variables = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(hostfile),
                 "PATH": os.environ.get("PATH", "")}
    with mock.patch.dict(os.environ, variables, clear=True):
        assert main(["run", "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert f"OMPI_MCA_orte_default_hostfile={hostfile}: the hostfile has no usable line" in err


def test_hostfile_line_without_a_host_names_the_file_and_line(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("job-worker-0.job slots=2\n  slots=2\n")  # the second worker's name left out
    variables = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(hostfile),
                 "PATH": os.environ.get("PATH", "")}
    with mock.patch.dict(os.environ, variables, clear=True):
        assert main(["run", "python", "-c", "pass"]) == 2
    assert f"{hostfile}:2: 'slots=2' names no host" in capsys.readouterr().err


def test_verbose_says_where_each_value_came_from(capsys: pytest.CaptureFixture[str]) -> None:
    # --check-build stops before anything starts, after the values are told
    with mock.patch.dict(os.environ, {**TRAINER_V2, "PATH": os.environ.get("PATH", "")}, clear=True):
        assert main(["run", "--verbose", "--check-build", "--nproc-per-node", "1"]) == 0
    err = capsys.readouterr().err
    assert "ringtrain run: --nnodes 2 (from PET_NNODES)" in err
    assert "ringtrain run: --nproc-per-node 1 (from command line)" in err
    assert "ringtrain run: --master-addr mnist-node-0-0.mnist (from PET_MASTER_ADDR)" in err
