"""horovodrun's gloo workers."""

from __future__ import annotations

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.base import EnvironmentError_


def _worker(**extra: str) -> dict[str, str]:
    """Rank 3 of 4 on hosts h1:2,h2:2 as horovodrun's gloo driver starts it."""
    env = {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
           "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": "h2",
           "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
           "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "41234"}
    env.update(extra)
    return env


def test_values() -> None:
    env = detect_environment(_worker())
    p = env.placement()
    assert p.environment == "horovod"
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (3, 4, 1, 2)
    assert (p.cross_rank, p.cross_size, p.node_rank, p.num_nodes, p.hostname) == (1, 2, 1, 2, "h2")
    assert (p.main_address, p.main_port) == ("10.0.0.1", 41235)
    assert env.validate() == []
    assert env.source_variables()["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"


def test_ringtrain_run_sets_master_addr_and_port_which_win() -> None:
    p = detect_environment(_worker(MASTER_ADDR="h1", MASTER_PORT="29511")).placement()
    assert (p.main_address, p.main_port) == ("h1", 29511)


def test_single_host_uses_loopback() -> None:
    env = detect_environment(_worker(HOROVOD_LOCAL_SIZE="4", HOROVOD_LOCAL_RANK="3", HOROVOD_CROSS_SIZE="1",
                                     HOROVOD_CROSS_RANK="0"))
    assert env.main_address() == "127.0.0.1"


def test_top_port_does_not_overflow() -> None:
    assert detect_environment(_worker(HOROVOD_GLOO_RENDEZVOUS_PORT="65535")).main_port() == 65534


def test_multi_host_without_any_address_asks_for_master_addr() -> None:
    env = detect_environment({k: v for k, v in _worker().items() if "RENDEZVOUS" not in k})
    with pytest.raises(EnvironmentError_, match="HINT: export MASTER_ADDR"):
        env.main_address()


def test_horovod_wins_over_the_mpi_variables_of_its_launch() -> None:
    env = detect_environment(_worker(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="3", PMI_RANK="3",
                                     PMI_SIZE="4"))
    assert env.name == "horovod"
