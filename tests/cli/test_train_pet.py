"""``ringtrain train`` reads torchrun's ``PET_*`` defaults exactly as ``ringtrain run`` does (the same flags,
ringtrain.cli.node_options), hands them to the launcher, and says where each came from. No process
starts: the launcher is replaced by one that resolves the plan and returns."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.plan import Plan, resolve_plan
from tests.cli.test_run_pet import JOBSET, PYTORCHJOB_ELASTIC, PYTORCHJOB_OLD, TRAINER_V2, exit_code, plan_for

QUICK = ["--subset", "64", "--epochs", "1", "--no-progress", "--threads", "1"]


def train(variables: dict[str, str], *argv: str) -> tuple[int, list[tuple[LaunchConfig, Plan]]]:
    """``ringtrain train mnist`` in an environment of just ``variables``: its exit code, and the
    configs (with their plans) it launched."""
    launched: list[tuple[LaunchConfig, Plan]] = []

    def fake_launch(config: LaunchConfig) -> int:
        launched.append((config, resolve_plan(config, dict(os.environ))))
        return 0

    with mock.patch.dict(os.environ, {**variables, "PATH": os.environ.get("PATH", "")}, clear=True), \
            mock.patch("ringtrain.launch.entry.launch", fake_launch), \
            mock.patch("ringtrain.train.job.run_job") as in_process:
        code = exit_code(["train", "mnist", *QUICK, *argv])
    if in_process.called:
        launched.append((None, "in process"))  # type: ignore[arg-type]
    return code, launched


@pytest.mark.parametrize(("variables", "argv"), [
    (TRAINER_V2, []),
    (PYTORCHJOB_OLD, []),
    (PYTORCHJOB_ELASTIC, []),
    (JOBSET, []),
    # explicit flags win over PET_* and the pod's own variables, as with ringtrain run
    (TRAINER_V2, ["--nproc-per-node", "1", "--node-rank", "0"]),
    (PYTORCHJOB_OLD, ["--node-rank", "0", "--master-addr", "elsewhere"]),
    ({**TRAINER_V2, "RINGTRAIN_NPROC_PER_NODE": "4"}, []),
])
def test_pods_place_the_ranks_as_ringtrain_run_does(variables: dict[str, str], argv: list[str]) -> None:
    code, launched = train(variables, *argv)
    assert code == 0
    ((config, plan),) = launched
    assert plan == plan_for(variables, *argv)
    assert config.command[1:3] == ("-m", "ringtrain.train.worker")


def test_np_is_the_ranks_in_all_over_the_nodes() -> None:
    code, launched = train(TRAINER_V2, "-np", "4", "--nproc-per-node", "2")
    assert code == 0
    assert launched[0][1] == plan_for(TRAINER_V2, "-np", "4", "--nproc-per-node", "2")
    code, launched = train({k: v for k, v in TRAINER_V2.items() if k != "PET_NPROC_PER_NODE"}, "-np", "4")
    assert (code, launched[0][1].nproc) == (0, 2)  # type: ignore[union-attr]


def test_pet_max_restarts_is_read() -> None:
    code, launched = train({**TRAINER_V2, "PET_MAX_RESTARTS": "2"}, "--snapshot-dir", "unused-snapshots")
    assert (code, launched[0][0].max_restarts) == (0, 2)
    code, launched = train({**TRAINER_V2, "PET_MAX_RESTARTS": "2"}, "--max-restarts", "0")
    assert (code, launched[0][0].max_restarts) == (0, 0)


def test_without_node_settings_it_trains_in_process() -> None:
    assert train({})[1] == [(None, "in process")]


def test_a_rank_ignores_the_pods_variables(capsys: pytest.CaptureFixture[str]) -> None:
    # `ringtrain run ringtrain train mnist` in a pod: the ranks inherit PET_*, but are placed already
    rank = {**TRAINER_V2, "TORCHELASTIC_RUN_ID": "job", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert train(rank) == (0, [(None, "in process")])
    # its launcher restarts it: PET_MAX_RESTARTS is not the rank's to act on (nor refused with --no-resume)
    assert train({**rank, "PET_MAX_RESTARTS": "2"}, "--no-resume") == (0, [(None, "in process")])
    code, launched = train(rank, "--nnodes", "2")
    assert (code, launched) == (2, [])
    assert "--nnodes: this ringtrain train is a rank that a launcher started" in capsys.readouterr().err


def test_a_rank_of_the_elastic_driver_ignores_them_too() -> None:
    from ringtrain.engine.elastic_rendezvous import ENV_WORKER

    # (the elastic driver's rank trains in process; its rendezvous is the driver's, not tested here)
    assert train({**TRAINER_V2, ENV_WORKER: "1"}, "--strategy", "horovod") == (0, [(None, "in process")])


def test_sources_of_the_pods_values_are_told(capsys: pytest.CaptureFixture[str]) -> None:
    assert train(TRAINER_V2, "--nproc-per-node", "1")[0] == 0
    err = capsys.readouterr().err
    assert "ringtrain train: --nnodes 2 (from PET_NNODES)" in err
    assert "ringtrain train: --node-rank 1 (from PET_NODE_RANK)" in err
    assert "ringtrain train: --master-addr mnist-node-0-0.mnist (from PET_MASTER_ADDR)" in err
    assert "--nproc-per-node 1" not in err  # given on the command line: nothing to tell


@pytest.mark.parametrize(("variables", "argv", "message"), [
    ({**TRAINER_V2, "PET_NNODES": "two"}, [], "PET_NNODES='two' is not N or MIN:MAX"),
    ({**TRAINER_V2, "PET_NODE_RANK": "2"}, [], "PET_NODE_RANK=2 is not below PET_NNODES=2"),
    ({**TRAINER_V2, "PET_NODE_RANK": "x"}, [], "PET_NODE_RANK='x' is not valid"),
    ({**TRAINER_V2, "PET_NPROC_PER_NODE": "many"}, [], "PET_NPROC_PER_NODE='many' is not a positive number"),
    ({**TRAINER_V2, "PET_MASTER_PORT": "70000"}, [], "PET_MASTER_PORT=70000 is not a TCP port"),
    ({**TRAINER_V2, "PET_STANDALONE": "maybe"}, [], "PET_STANDALONE='maybe' is not a boolean"),
    ({**TRAINER_V2, "PET_MAX_RESTARTS": "-1"}, [], "PET_MAX_RESTARTS=-1 must be at least 0"),
    ({**PYTORCHJOB_OLD, "RANK": "5"}, [], "RANK=5 is beyond WORLD_SIZE=4"),
    ({**PYTORCHJOB_OLD, "RANK": "3", "WORLD_SIZE": "8"}, [], "RANK=3 is not below the 2 nodes"),
    (TRAINER_V2, ["--strategy", "horovod", "--min-np", "1"],
     "PET_NNODES=2, PET_NPROC_PER_NODE=3, PET_NODE_RANK=1"),
])
def test_bad_values_name_the_variable_and_exit_2(variables: dict[str, str], argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, launched = train(variables, *argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "HINT" in err
    assert "Traceback" not in err
    assert launched == []
