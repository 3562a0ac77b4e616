"""torchrun and plain env://, and their conflicts with an enclosing Slurm step."""

from __future__ import annotations

from ringtrain.env import detect_environment

STEP = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"}


def _torchrun(**extra: str) -> dict[str, str]:
    return {"TORCHELASTIC_RUN_ID": "job", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "n0",
            "MASTER_PORT": "29400", **extra}


def test_torchrun_values() -> None:
    env = detect_environment(_torchrun())
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.local_rank, p.local_world_size) == ("torchrun", 5, 8, 1, 4)
    assert (p.node_rank, p.num_nodes, p.main_address, p.main_port) == (1, 2, "n0", 29400)
    assert env.validate() == []
    assert env.source_variables()["GROUP_RANK"] == "1"


def test_torchrun_inside_one_task_per_node_is_fine() -> None:
    env = detect_environment({**STEP, "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", **_torchrun()})
    assert env.name == "torchrun"
    assert env.validate() == []


def test_one_torchrun_per_task_with_too_few_nodes_is_reported() -> None:
    env = detect_environment({**STEP, **_torchrun()})
    warnings = env.validate()
    assert any("2 agent(s)" in w and "4 tasks" in w and "HINT" in w for w in warnings), warnings


def test_plain_env_smaller_than_the_slurm_step_is_reported() -> None:
    env = detect_environment({**STEP, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "n0"})
    assert env.name == "env"
    assert any("WORLD_SIZE=2" in w and "4 tasks" in w for w in env.validate())


def test_plain_env_over_several_nodes_without_master_addr_is_reported() -> None:
    env = detect_environment({"RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                              "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert any("MASTER_ADDR is not set" in w for w in env.validate())


def test_plain_env_on_one_node_needs_no_master_addr() -> None:
    env = detect_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert env.validate() == []
    assert env.main_address() == "127.0.0.1"


def test_deepspeed_launcher_names() -> None:
    env = detect_environment({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_SIZE": "4",
                              "CROSS_RANK": "1", "CROSS_SIZE": "2", "MASTER_ADDR": "n0"})
    p = env.placement()
    assert (p.environment, p.local_world_size, p.node_rank, p.num_nodes) == ("env", 4, 1, 2)
    assert env.validate() == []


def test_lightning_node_rank() -> None:
    env = detect_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                              "NODE_RANK": "1", "MASTER_ADDR": "n0"})
    assert (env.node_rank(), env.num_nodes()) == (1, 2)
