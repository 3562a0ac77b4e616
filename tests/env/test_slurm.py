"""Slurm: step values, the batch-shell trap, the interactive exemption, conflicts."""

from __future__ import annotations

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_
from ringtrain.env.slurm import SlurmEnvironment, SlurmShellEnvironment


def _step(**extra: str) -> dict[str, str]:
    """Task 5 of an srun step: 10 tasks on 3 nodes (4, 4, 2), this one on the second node."""
    env = {
        "SLURM_JOB_ID": "1234567", "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS": "10",
        "SLURM_STEP_NUM_TASKS": "10", "SLURM_NNODES": "3", "SLURM_STEP_NUM_NODES": "3",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2),2", "SLURM_TASKS_PER_NODE": "4(x2),2",
        "SLURM_STEP_NODELIST": "gpu[07-08],cpu1", "SLURM_JOB_NODELIST": "gpu[07-08],cpu1",
        "SLURMD_NODENAME": "gpu08",
    }
    env.update(extra)
    return env


def test_step_values() -> None:
    env = detect_environment(_step())
    assert isinstance(env, SlurmEnvironment)
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.local_rank, p.local_world_size) == ("slurm", 5, 10, 1, 4)
    assert (p.node_rank, p.num_nodes, p.hostname) == (1, 3, "gpu08")
    assert (p.main_address, p.main_port) == ("gpu07", 15000 + 4567)
    assert env.validate() == []


def test_last_node_gets_its_own_task_count() -> None:
    p = SlurmEnvironment(_step(SLURM_PROCID="9", SLURM_LOCALID="1", SLURM_NODEID="2",
                               SLURMD_NODENAME="cpu1")).placement()
    assert (p.local_world_size, p.node_rank) == (2, 2)


def test_explicit_master_address_and_port_win() -> None:
    p = SlurmEnvironment(_step(MASTER_ADDR="10.1.2.3", MASTER_PORT="4321")).placement()
    assert (p.main_address, p.main_port) == ("10.1.2.3", 4321)


def test_step_on_a_subset_uses_the_step_node_list() -> None:
    env = SlurmEnvironment(_step(SLURM_STEP_NODELIST="gpu08", SLURM_STEP_NUM_NODES="1",
                                 SLURM_NODEID="0", SLURM_STEP_TASKS_PER_NODE="10"))
    assert env.main_address() == "gpu08"


def test_old_style_job_variables() -> None:
    env = {"SLURM_JOBID": "42", "SLURM_STEPID": "3", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "n1", "SLURM_TASKS_PER_NODE": "2"}
    p = detect_environment(env).placement()
    assert (p.environment, p.rank, p.world_size, p.local_world_size, p.main_address, p.main_port) == (
        "slurm", 1, 2, 2, "n1", 15042)


def test_srun_pty_shell_is_a_shell() -> None:
    env = detect_environment(_step(SLURM_JOB_NAME="bash", SLURM_PTY_PORT="40123", SLURM_STEP_NUM_TASKS="1",
                                   SLURM_NTASKS="1", SLURM_PROCID="0"))
    assert isinstance(env, SlurmShellEnvironment)
    assert env.interactive
    assert env.placement().world_size == 1
    assert not env.batch_without_srun
    assert env.validate() == []


@pytest.mark.parametrize("name", ["bash", "interactive"])
def test_srun_tasks_in_jobs_named_like_shells_are_ranks(name: str) -> None:
    # salloc names its job "interactive", `srun bash -c ...` names it "bash": their srun tasks are ranks.
    env = detect_environment(_step(SLURM_JOB_NAME=name))
    assert isinstance(env, SlurmEnvironment)
    assert env.placement().world_size == 10


@pytest.mark.parametrize("name", ["bash", "interactive"])
def test_interactive_shells_do_not_warn_about_srun(name: str) -> None:
    env = detect_environment(_batch(SLURM_JOB_NAME=name))
    assert isinstance(env, SlurmShellEnvironment)
    assert env.interactive
    assert not env.batch_without_srun
    assert env.validate() == []


def _batch(**extra: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "99", "SLURM_JOB_NAME": "train.sbatch", "SLURM_NTASKS": "8",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "4(x2)",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    env.update(extra)
    return env


def test_batch_script_without_srun_runs_alone_and_warns() -> None:
    env = detect_environment(_batch())
    assert isinstance(env, SlurmShellEnvironment)
    assert env.batch_without_srun
    p = env.placement()
    assert (p.environment, p.rank, p.world_size) == ("slurm-shell", 0, 1)
    assert env.allocation_hosts() == ["node1", "node2"]
    assert env.tasks_per_node() == [4, 4]
    (warning,) = env.validate()
    assert "SLURM_NTASKS=8" in warning
    assert "srun" in warning
    assert "HINT" in warning


@pytest.mark.parametrize("step", ["batch", "extern"])
def test_named_batch_and_extern_steps_are_shells(step: str) -> None:
    assert isinstance(detect_environment(_batch(SLURM_STEP_ID=step)), SlurmShellEnvironment)


def test_batch_script_with_one_task_does_not_warn() -> None:
    env = detect_environment(_batch(SLURM_NTASKS="1"))
    assert not env.batch_without_srun
    assert env.validate() == []


@pytest.mark.parametrize(("torch_name", "value", "slurm_name"), [
    ("RANK", "0", "SLURM_PROCID=5"),
    ("WORLD_SIZE", "4", "SLURM_NTASKS=10"),
    ("LOCAL_RANK", "3", "SLURM_LOCALID=1"),
])
def test_torch_variables_that_disagree_with_slurm_are_reported(torch_name: str, value: str,
                                                                slurm_name: str) -> None:
    env = detect_environment(_step(**{torch_name: value}))
    assert isinstance(env, SlurmEnvironment)
    warnings = env.validate()
    assert any(f"{torch_name}={value}" in w and slurm_name in w for w in warnings), warnings


def test_torch_variables_that_agree_are_fine() -> None:
    assert SlurmEnvironment(_step(LOCAL_RANK="1")).validate() == []


def test_node_list_that_does_not_match_the_node_count_is_reported() -> None:
    warnings = SlurmEnvironment(_step(SLURM_STEP_NODELIST="gpu07,gpu08")).validate()
    assert any("2 hosts" in w and "3" in w for w in warnings), warnings


def test_bad_integer_is_a_warning_not_a_crash() -> None:
    env = SlurmEnvironment(_step(SLURM_PROCID="five"))
    warnings = env.validate()
    assert any("SLURM_PROCID='five'" in w and "HINT" in w for w in warnings)
    with pytest.raises(EnvironmentError_, match="SLURM_PROCID"):
        env.placement()


@pytest.mark.parametrize("step", ["batch", "extern", "interactive", "4294967294", "4294967295", "4294967291"])
def test_the_steps_that_are_not_srun_are_shells_by_name_and_by_sentinel(step: str) -> None:
    """A batch script whose Slurm exports the 0xFFFFFFFE sentinel is a shell, not rank 5 of 10 (the hang)."""
    env = detect_environment(_step(SLURM_STEP_ID=step))
    assert isinstance(env, SlurmShellEnvironment)
    assert env.world_size() == 1
