"""Detection on variable sets captured from real Slurm 22.05 and Open MPI 4.1 launches (tests/env/data)."""

from __future__ import annotations

from pathlib import Path

from ringtrain.env import detect_environment
from ringtrain.env.slurm import SlurmShellEnvironment

DATA = Path(__file__).resolve().parent / "data"


def _load(name: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DATA / name).read_text().splitlines() if "=" in line)
    return dict(pairs)


def test_real_srun_task() -> None:
    env = detect_environment(_load("slurm22_step.1.env"))
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.local_rank, p.local_world_size) == ("slurm", 1, 2, 1, 2)
    assert (p.node_rank, p.num_nodes, p.main_address, p.main_port, p.hostname) == (0, 1, "vm", 15001, "vm")
    assert env.validate() == []


def test_real_batch_shell_is_one_process_and_warns_about_srun() -> None:
    env = detect_environment(_load("slurm22_batch.env"))
    assert isinstance(env, SlurmShellEnvironment)
    assert env.batch_without_srun
    assert env.placement().world_size == 1
    assert env.allocation_hosts() == ["vm"]
    assert env.tasks_per_node() == [2]
    assert len(env.validate()) == 1


def test_real_salloc_shell_is_interactive() -> None:
    env = detect_environment(_load("slurm22_salloc.env"))
    assert isinstance(env, SlurmShellEnvironment)
    assert env.interactive
    assert not env.batch_without_srun
    assert env.validate() == []


def test_real_open_mpi_rank() -> None:
    env = detect_environment(_load("openmpi41_rank1.env"))
    p = env.placement()
    assert (p.environment, p.rank, p.world_size, p.local_rank, p.local_world_size) == ("openmpi", 1, 2, 1, 2)
    assert (p.node_rank, p.num_nodes, p.main_address) == (0, 1, "127.0.0.1")
    assert p.main_port == 15000 + 7585  # from OMPI_MCA_ess_base_jobid=1125187585
    assert env.validate() == []


def test_open_mpi_started_inside_a_slurm_step_is_read_as_open_mpi() -> None:
    # mpirun starts its daemons with srun, so ranks inherit the daemon's step: Open MPI must win.
    step = _load("slurm22_step.1.env")
    env = detect_environment({**step, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1",
                              **_load("openmpi41_rank1.env")})
    assert (env.name, env.global_rank(), env.world_size()) == ("openmpi", 1, 2)
