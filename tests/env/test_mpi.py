"""MPI launchers: values from each launcher's variables, the main-address rule, the derived port."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_, port_from_job_id

#: Rank 3 of 4, two per node, as each launcher names it (a real Open MPI 4.1 worker's set, trimmed).
LAUNCHERS = {
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1",
                "OMPI_MCA_orte_num_nodes": "2", "OMPI_MCA_ess_base_jobid": "1969553409",
                "OMPI_MCA_orte_hnp_uri": "1969553408.0;tcp://192.0.2.2:36233;tcp6://[fd00::2]:60697",
                "PMIX_RANK": "3", "PMIX_NAMESPACE": "1969553409"},
    "mpich": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "mvapich": {"MV2_COMM_WORLD_RANK": "3", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
                "MV2_COMM_WORLD_LOCAL_SIZE": "2"},
    "pals": {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PMI_RANK": "3",
             "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"},
    "pmix": {"PMIX_RANK": "3", "PMIX_NAMESPACE": "prterun-host-1234@1", "WORLD_SIZE": "4",
             "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_values_from_each_launcher(name: str) -> None:
    env = detect_environment({**LAUNCHERS[name], "MASTER_ADDR": "n0"})
    p = env.placement()
    assert p.environment == name
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (3, 4, 1, 2)
    assert (p.node_rank, p.num_nodes, p.main_address) == (1, 2, "n0")
    assert env.validate() == []


def test_open_mpi_node_rank_is_not_ompi_comm_world_node_rank() -> None:
    # Rank 1 of 4 on the first node: Open MPI's NODE_RANK is a per-node index (1), not the node (0).
    env = detect_environment({**LAUNCHERS["openmpi"], "OMPI_COMM_WORLD_RANK": "1",
                              "OMPI_COMM_WORLD_NODE_RANK": "1", "MASTER_ADDR": "n0"})
    assert env.node_rank() == 0


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_single_node_uses_loopback(name: str) -> None:
    local = {"openmpi": "OMPI_COMM_WORLD_LOCAL_SIZE", "mpich": "MPI_LOCALNRANKS", "pals": "PMI_LOCAL_SIZE",
             "mvapich": "MV2_COMM_WORLD_LOCAL_SIZE", "pmix": "LOCAL_WORLD_SIZE"}[name]
    env = detect_environment({**LAUNCHERS[name], local: "4", "OMPI_MCA_orte_num_nodes": "1"})
    assert env.main_address() == "127.0.0.1"


def test_multi_node_open_mpi_falls_back_to_the_host_of_mpirun() -> None:
    assert detect_environment(LAUNCHERS["openmpi"]).main_address() == "192.0.2.2"


@pytest.mark.parametrize("name", ["mpich", "mvapich", "pals", "pmix"])
def test_multi_node_without_any_hint_asks_for_master_addr(name: str) -> None:
    env = detect_environment(LAUNCHERS[name])
    with pytest.raises(EnvironmentError_, match="HINT: export MASTER_ADDR"):
        env.main_address()
    assert any("MASTER_ADDR" in w for w in env.validate())


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_first_host_of_a_slurm_allocation_is_the_main_address(name: str) -> None:
    env = detect_environment({**LAUNCHERS[name], "SLURM_JOB_ID": "777", "SLURM_JOB_NODELIST": "cn[10-11]"})
    assert env.name == name
    assert env.main_address() == "cn10"


def test_first_line_of_the_pbs_node_file_is_the_main_address(tmp_path: Path) -> None:
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1001c0s0b0n0\nx1001c0s0b0n0\nx1001c0s0b1n0\nx1001c0s0b1n0\n")
    env = detect_environment({**LAUNCHERS["pals"], "PBS_JOBID": "8812.pbs01", "PBS_NODEFILE": str(nodefile)})
    p = env.placement()
    assert (p.environment, p.main_address, p.num_nodes) == ("pals", "x1001c0s0b0n0", 2)
    assert p.main_port == port_from_job_id("8812.pbs01") == 15000 + 8812


@pytest.mark.parametrize(("name", "job_id"), [
    ("openmpi", "1969553409"),
    ("pmix", "prterun-host-1234@1"),
])
def test_port_comes_from_the_launcher_job_id(name: str, job_id: str) -> None:
    assert detect_environment(LAUNCHERS[name]).main_port() == port_from_job_id(job_id)


def test_port_falls_back_to_the_allocation_job_id() -> None:
    env = detect_environment({**LAUNCHERS["mpich"], "SLURM_JOB_ID": "31337"})
    assert env.main_port() == 15000 + 1337


def test_port_without_any_job_id_is_torch_default() -> None:
    assert detect_environment(LAUNCHERS["mvapich"]).main_port() == 29500


def test_explicit_port_wins_and_a_bad_one_is_named() -> None:
    assert detect_environment({**LAUNCHERS["openmpi"], "MASTER_PORT": "5555"}).main_port() == 5555
    env = detect_environment({**LAUNCHERS["openmpi"], "MASTER_PORT": "http"})
    with pytest.raises(EnvironmentError_, match="MASTER_PORT='http'"):
        env.main_port()
    assert any("MASTER_PORT" in w for w in env.validate())
    with pytest.raises(EnvironmentError_, match="1..65535"):
        detect_environment({**LAUNCHERS["openmpi"], "MASTER_PORT": "70000"}).main_port()


def test_missing_local_size_is_guessed_and_reported() -> None:
    env = detect_environment({"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_JOB_ID": "1",
                              "SLURM_JOB_NODELIST": "a[1-2]"})
    assert (env.local_world_size(), env.local_rank(), env.node_rank()) == (4, 1, 1)
    assert any("assuming 4 processes per node" in w for w in env.validate())


def test_pmix_without_a_size_says_what_to_set() -> None:
    env = detect_environment({"PMIX_RANK": "0"})
    assert env.name == "pmix"
    with pytest.raises(EnvironmentError_, match="HINT: export WORLD_SIZE"):
        env.world_size()


def test_pmix_takes_the_size_from_slurm_variables_outside_a_step() -> None:
    env = detect_environment({"PMIX_RANK": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "5"})
    assert (env.name, env.world_size(), env.local_world_size()) == ("pmix", 2, 2)


def test_rank_outside_the_world_is_reported() -> None:
    warnings = detect_environment({**LAUNCHERS["mpich"], "PMI_RANK": "4"}).validate()
    assert any("rank 4 is outside the world of 4" in w for w in warnings)


def test_local_size_that_does_not_divide_the_world_is_reported() -> None:
    warnings = detect_environment({**LAUNCHERS["mvapich"], "MV2_COMM_WORLD_SIZE": "5",
                                   "MV2_COMM_WORLD_RANK": "1", "MASTER_ADDR": "n0"}).validate()
    assert any("does not divide" in w for w in warnings)
