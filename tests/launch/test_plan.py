"""Where ranks go under Slurm, PBS, hosts and torchrun flags (no processes)."""

import argparse

import pytest

from ringtrain.cli.run import add_run_arguments, config_from_args
from ringtrain.exceptions import UsageError
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.plan import HostsPlan, NodePlan, SrunPlan, resolve_plan


def config(*argv):
    parser = argparse.ArgumentParser()
    add_run_arguments(parser, environ={})
    return config_from_args(parser.parse_args([*argv, "python", "x.py"]))


SLURM_STEP = {"SLURM_JOB_ID": "123456", "SLURM_NNODES": "2", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2",
              "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
              "SLURM_PROCID": "1", "SLURM_JOB_NODELIST": "node[07-08]"}


def test_plain_local_run():
    plan = resolve_plan(config("-np", "3"), {})
    assert isinstance(plan, NodePlan)
    assert plan.local_only
    assert plan.nproc == 3


def test_srun_step_one_task_per_node():
    plan = resolve_plan(config("-np", "8"), SLURM_STEP)
    assert isinstance(plan, NodePlan)
    assert (plan.nproc, plan.node_rank, plan.max_nodes) == (4, 1, 2)
    assert plan.rdzv_endpoint == "node07:18456"


def test_explicit_master_wins_under_srun():
    plan = resolve_plan(config("--nproc-per-node", "2", "--master-port", "4000"),
                        {**SLURM_STEP, "MASTER_ADDR": "head"})
    assert plan.rdzv_endpoint == "head:4000"
    assert plan.nproc == 2


def test_srun_with_many_tasks_per_node_is_refused():
    with pytest.raises(UsageError, match="--ntasks-per-node=1"):
        resolve_plan(config(), {**SLURM_STEP, "SLURM_STEP_NUM_TASKS": "8"})


@pytest.mark.parametrize("step", [None, "batch", "4294967294"])
def test_batch_script_relaunches_through_srun(step):
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)"}
    if step:
        env.update(SLURM_STEP_ID=step, SLURM_PROCID="0")
    assert resolve_plan(config(), env) == SrunPlan(nnodes=2, nproc_per_node=4)


def test_single_node_srun_step_uses_a_local_free_port():
    env = {**SLURM_STEP, "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "1",
           "SLURM_NODEID": "0"}
    plan = resolve_plan(config("-np", "2"), env)
    assert plan.local_only
    assert plan.nproc == 2


def test_np_must_divide_over_slurm_nodes():
    with pytest.raises(UsageError, match="does not divide"):
        resolve_plan(config("-np", "3"), {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2"})


def test_pbs_nodefile_gives_hosts(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\nn1\nn2\nn2\n")
    plan = resolve_plan(config(), {"PBS_JOBID": "1.server", "PBS_NODEFILE": str(nodefile)})
    assert plan == HostsPlan((HostSlots("n1", 2), HostSlots("n2", 2)), 4, "PBS_NODEFILE")


def test_explicit_hosts_win_over_allocation():
    plan = resolve_plan(config("-H", "a:1"), SLURM_STEP)
    assert isinstance(plan, HostsPlan)
    assert plan.hosts == (HostSlots("a", 1),)


def test_torchrun_node_flags():
    plan = resolve_plan(config("--nnodes", "2", "--node-rank", "1", "--nproc_per_node", "3",
                               "--rdzv-endpoint", "h0:29400"), {})
    assert isinstance(plan, NodePlan)
    assert (plan.nproc, plan.node_rank, plan.rdzv_backend, plan.rdzv_endpoint) == (3, 1, "static", "h0:29400")
    elastic = resolve_plan(config("--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h0:1"), {})
    assert (elastic.min_nodes, elastic.max_nodes, elastic.rdzv_backend) == (1, 4, "c10d")


def test_nodes_started_by_hand_share_one_run_id():
    """Without --rdzv-id every node must name the rendezvous alike, or they never meet."""
    plans = [resolve_plan(config("--nnodes", "2", "--node-rank", str(rank), "--master-addr", "10.0.0.1"), {})
             for rank in (0, 1)]
    assert plans[0].run_id == plans[1].run_id
    named = resolve_plan(config("--nnodes", "2", "--master-addr", "h", "--rdzv-id", "job7"), {})
    assert named.run_id == "job7"


def test_lsf_hostfile_gives_hosts(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1\nn1\nn2\nn2\n")
    plan = resolve_plan(config(), {"LSB_JOBID": "4711", "LSB_DJOB_HOSTFILE": str(hostfile)})
    assert plan == HostsPlan((HostSlots("n1", 2), HostSlots("n2", 2)), 4, "LSB_DJOB_HOSTFILE")


def test_nproc_per_node_wins_over_the_slots_of_a_host_file(tmp_path):
    """A job holding 8 cores per node for 2 ranks of 4 threads each: the host file lists 8 slots."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1\n" * 8 + "n2\n" * 8)
    plan = resolve_plan(config("--nproc-per-node", "2"), {"PBS_JOBID": "1.s", "PBS_NODEFILE": str(nodefile)})
    assert plan == HostsPlan((HostSlots("n1", 2), HostSlots("n2", 2)), 4, "PBS_NODEFILE")


def test_a_broken_host_file_is_a_usage_error_naming_it(tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("n1 slots=x\n")
    with pytest.raises(UsageError, match="PBS_NODEFILE: .*slots='x'.*HINT"):
        resolve_plan(config(), {"PBS_JOBID": "1.s", "PBS_NODEFILE": str(nodefile)})
    with pytest.raises(UsageError, match="PBS_NODEFILE: cannot read the node file"):
        resolve_plan(config(), {"PBS_JOBID": "1.s", "PBS_NODEFILE": str(tmp_path / "missing")})


def test_srun_pty_shell_is_a_one_node_step():
    """``srun --pty bash`` in an allocation is a step: ringtrain run there starts the ranks of its node and
    never nests another srun."""
    env = {**SLURM_STEP, "SLURM_PTY_PORT": "4242", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_STEP_NUM_TASKS": "1", "SLURM_NODEID": "0"}
    plan = resolve_plan(config("-np", "2"), env)
    assert isinstance(plan, NodePlan)
    assert (plan.local_only, plan.nproc, plan.source) == (True, 2, "slurm step (one node)")


def test_lsf_rank_file_wins_and_drops_the_launch_node(tmp_path):
    rankfile = tmp_path / "rankfile"
    rankfile.write_text("batch1\n" + "c1\n" * 2 + "c2\n" * 2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("batch1\n" + "c1\n" * 2 + "c2\n" * 2)
    plan = resolve_plan(config(), {"LSB_JOBID": "4711", "LSB_DJOB_RANKFILE": str(rankfile),
                                   "LSB_DJOB_HOSTFILE": str(hostfile)})
    assert plan == HostsPlan((HostSlots("c1", 2), HostSlots("c2", 2)), 4, "LSB_DJOB_RANKFILE")


def test_slurm_step_without_a_node_list_asks_for_the_master_address():
    env = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_JOB_NODELIST"}
    with pytest.raises(UsageError, match="--master-addr"):
        resolve_plan(config(), env)
    assert resolve_plan(config("--master-addr", "h0"), env).rdzv_endpoint == "h0:18456"


def test_pbs_job_without_a_node_file_runs_here():
    plan = resolve_plan(config("-np", "2"), {"PBS_JOBID": "1.s"})
    assert isinstance(plan, NodePlan)
    assert (plan.local_only, plan.nproc, plan.source) == (True, 2, "local")


def test_a_slurm_variable_that_is_not_a_number_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match="SLURM_NNODES='two' is not an integer.*HINT"):
        resolve_plan(config(), {"SLURM_JOB_ID": "7", "SLURM_NNODES": "two"})
