"""The scheduler job around a process: which environment object answers, and what it says."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest

from ringtrain.env.allocation import allocation_first_host, allocation_hosts, allocation_job_id, scheduler_job
from ringtrain.env.lsf import LsfEnvironment, lsf_host_file, lsf_slot_hosts
from ringtrain.env.pbs import PbsEnvironment
from ringtrain.env.slurm import NON_SRUN_STEPS, SlurmEnvironment, SlurmShellEnvironment

STEP = {"SLURM_JOB_ID": "123456", "SLURM_NNODES": "2", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "node[07-08]"}
BATCH = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)",
         "SLURM_JOB_NODELIST": "cn[1-2]"}


@pytest.mark.parametrize(("environ", "kind"), [
    ({}, type(None)),
    (STEP, SlurmEnvironment),
    ({**STEP, "SLURM_PTY_PORT": "4242"}, SlurmEnvironment),  # an srun --pty shell is still a step
    ({**STEP, "SLURM_STEP_ID": "batch"}, SlurmShellEnvironment),
    ({**STEP, "SLURM_STEP_ID": "4294967294"}, SlurmShellEnvironment),  # the batch step's sentinel
    (BATCH, SlurmShellEnvironment),
    ({"SLURM_JOBID": "7"}, SlurmShellEnvironment),  # the older name of the job id
    ({"PBS_JOBID": "1.server"}, PbsEnvironment),
    ({"LSB_JOBID": "4711"}, LsfEnvironment),
    ({**BATCH, "PBS_JOBID": "1.server"}, SlurmShellEnvironment),  # Slurm first, as the launcher always did
])
def test_scheduler_job_picks_the_environment_object(environ: dict[str, str], kind: type) -> None:
    with mock.patch.dict(os.environ, environ, clear=True):
        assert type(scheduler_job(os.environ)) is kind


@pytest.mark.parametrize(("environ", "in_step", "nodes", "per_node", "node_rank"), [
    (STEP, True, 2, None, 1),
    ({**STEP, "SLURM_PTY_PORT": "4242"}, True, 2, None, 1),
    (BATCH, False, 2, 4, 0),
    ({**BATCH, "SLURM_NTASKS_PER_NODE": "3"}, False, 2, 3, 0),
    ({**BATCH, "SLURM_TASKS_PER_NODE": "2,3(x2)"}, False, 2, 3, 0),
    ({**BATCH, "SLURM_TASKS_PER_NODE": "garbage"}, False, 2, None, 0),
    ({"SLURM_JOB_ID": "7"}, False, None, None, 0),
])
def test_slurm_facts(environ: dict[str, str], in_step: bool, nodes: int | None, per_node: int | None,
                     node_rank: int) -> None:
    with mock.patch.dict(os.environ, environ, clear=True):
        job = scheduler_job(os.environ)
        assert isinstance(job, SlurmEnvironment | SlurmShellEnvironment)
        assert (job.in_srun_step, job.job_nodes, job.max_tasks_per_node, job.node_rank()) == \
            (in_step, nodes, per_node, node_rank)
        assert job.job_id == environ["SLURM_JOB_ID"]


def test_step_kinds_are_one_list() -> None:
    """Names (Slurm >= 20) and the 0xFFFFFFFx sentinels of older releases alike."""
    assert {"batch", "extern", "interactive", str(0xFFFFFFFE), str(0xFFFFFFFF)} <= NON_SRUN_STEPS
    assert "0" not in NON_SRUN_STEPS


def test_slurm_step_hosts_prefer_the_step_list() -> None:
    with mock.patch.dict(os.environ, {**STEP, "SLURM_STEP_NODELIST": "node08"}, clear=True):
        job = scheduler_job(os.environ)
        assert isinstance(job, SlurmEnvironment)
        assert job.step_hosts() == ["node08"]
        assert job.allocation_hosts() == ["node07", "node08"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    rank = tmp_path / "rankfile"
    rank.write_text("batch1\n" + "c01\n" * 2 + "c02\n" * 2)  # the launch node first, then slots
    host = tmp_path / "hostfile"
    host.write_text("e01\n" * 2 + "e02\n")
    nodes = tmp_path / "nodes"
    nodes.write_text("n1\nn1\nn2\n")
    return {"rank": str(rank), "host": str(host), "nodes": str(nodes)}


@pytest.mark.parametrize(("names", "variable", "slots"), [
    ((), None, []),
    (("LSB_DJOB_HOSTFILE",), "LSB_DJOB_HOSTFILE", ["e01", "e01", "e02"]),
    (("LSB_DJOB_RANKFILE",), "LSB_DJOB_RANKFILE", ["c01", "c01", "c02", "c02"]),
    (("LSB_DJOB_RANKFILE", "LSB_DJOB_HOSTFILE"), "LSB_DJOB_RANKFILE", ["c01", "c01", "c02", "c02"]),
])
def test_lsf_reads_the_rank_file_else_the_host_file(files: dict[str, str], names: tuple[str, ...],
                                                    variable: str | None, slots: list[str]) -> None:
    paths = {"LSB_DJOB_RANKFILE": files["rank"], "LSB_DJOB_HOSTFILE": files["host"]}
    with mock.patch.dict(os.environ, {"LSB_JOBID": "4711", **{n: paths[n] for n in names}}, clear=True):
        assert lsf_host_file(os.environ) == variable
        assert lsf_slot_hosts(os.environ) == slots
        job = scheduler_job(os.environ)
        assert isinstance(job, LsfEnvironment)
        assert job.host_file_variable == variable
        assert job.hosts() == list({h: slots.count(h) for h in slots}.items())
        assert allocation_hosts(os.environ) == list(dict.fromkeys(slots))


@pytest.mark.parametrize(("environ", "hosts", "job_id"), [
    ({}, [], None),
    ({"SLURM_JOB_ID": "777", "SLURM_JOB_NODELIST": "cn[10-11]"}, ["cn10", "cn11"], "777"),
    ({"SLURM_JOBID": "778", "SLURM_NODELIST": "cn12"}, ["cn12"], "778"),
    ({"PBS_JOBID": "8812.pbs01", "PBS_NODEFILE": "nodes"}, ["n1", "n2"], "8812.pbs01"),
    ({"PBS_JOBID": "8812.pbs01"}, [], "8812.pbs01"),
    ({"LSB_JOBID": "4711", "LSB_DJOB_HOSTFILE": "host"}, ["e01", "e02"], "4711"),
])
def test_allocation_hosts_and_job_id(files: dict[str, str], environ: dict[str, str], hosts: list[str],
                                     job_id: str | None) -> None:
    environ = {k: files.get(v, v) if k.endswith(("FILE", "NODEFILE")) else v for k, v in environ.items()}
    with mock.patch.dict(os.environ, environ, clear=True):
        assert allocation_hosts(os.environ) == hosts
        assert allocation_first_host(os.environ) == (hosts[0] if hosts else None)
        assert allocation_job_id(os.environ) == job_id


def test_pbs_host_file_variable(files: dict[str, str]) -> None:
    with mock.patch.dict(os.environ, {"PBS_JOBID": "1.s", "PBS_NODEFILE": files["nodes"]}, clear=True):
        job = scheduler_job(os.environ)
        assert isinstance(job, PbsEnvironment)
        assert job.host_file_variable == "PBS_NODEFILE"
        assert job.hosts() == [("n1", 2), ("n2", 1)]
    with mock.patch.dict(os.environ, {"PBS_JOBID": "1.s"}, clear=True):
        assert PbsEnvironment().host_file_variable is None
