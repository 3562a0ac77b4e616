"""Shared rules: derived ports, host matching, explicit MASTER_ADDR/MASTER_PORT, consistency checks."""

from __future__ import annotations

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_, port_from_job_id, read_port, same_host


@pytest.mark.parametrize(("job_id", "port"), [
    ("12345678", 20678),
    ("42", 15042),
    ("8812.pbs01", 23812),
    ("1969553409", 18409),
    ("slurm.pmix.123.0", 15123),
])
def test_port_from_job_id(job_id: str, port: int) -> None:
    assert port_from_job_id(job_id) == port


def test_port_from_an_id_without_digits_is_stable_and_in_range() -> None:
    port = port_from_job_id("prterun-namespace")
    assert port == port_from_job_id("prterun-namespace")
    assert 15000 <= port < 25000
    assert port != port_from_job_id("another-namespace")


@pytest.mark.parametrize(("a", "b", "same"), [
    ("n1", "n1", True), ("n1.cluster.org", "N1", True), ("n1", "n10", False), ("", "", False),
])
def test_same_host(a: str, b: str, same: bool) -> None:
    assert same_host(a, b) is same


@pytest.mark.parametrize("value", ["0", "65536", "-1", "x", " "])
def test_read_port_rejects(value: str) -> None:
    with pytest.raises(EnvironmentError_, match="HINT"):
        read_port({"P": value}, "P")


@pytest.mark.parametrize("variables", [
    {},
    {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
     "SLURM_JOB_NODELIST": "n1"},
    {"PMI_RANK": "0", "PMI_SIZE": "1"},
    {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "1000"},
])
def test_explicit_master_address_and_port_win_everywhere(variables: dict[str, str]) -> None:
    p = detect_environment({**variables, "MASTER_ADDR": "head", "MASTER_PORT": "6000"}).placement()
    assert (p.main_address, p.main_port) == ("head", 6000)


def test_local_rank_outside_the_node_is_reported() -> None:
    env = detect_environment({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                              "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert any("local rank 2 is outside" in w for w in env.validate())


def test_local_size_larger_than_world_is_reported() -> None:
    env = detect_environment({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2",
                              "MV2_COMM_WORLD_LOCAL_RANK": "0", "MV2_COMM_WORLD_LOCAL_SIZE": "4"})
    assert any("larger than the world size" in w for w in env.validate())


def test_zero_world_size_is_reported() -> None:
    env = detect_environment({"PMI_RANK": "0", "PMI_SIZE": "0", "MPI_LOCALRANKID": "0",
                              "MPI_LOCALNRANKS": "1"})
    assert any("world size 0 is not positive" in w for w in env.validate())
