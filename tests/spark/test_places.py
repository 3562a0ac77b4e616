"""Ranks of a barrier stage's tasks, grouped by executor host, and each rank's variables."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[test,ray,spark]')")

from ringtrain.spark.places import assign_places, host_of, rank_environ


@pytest.mark.parametrize(("address", "host"), [
    ("hostA:38021", "hostA"), ("10.0.0.2:7078", "10.0.0.2"), ("[fe80::1]:7078", "fe80::1"),
    ("hostB", "hostB"), ("fe80::1", "fe80::1"),
])
def test_host_of_an_address(address: str, host: str) -> None:
    assert host_of(address) == host


def test_ranks_are_grouped_by_host_and_listed_in_partition_order() -> None:
    # partitions 0 and 2 on B, 1 on A: B holds more tasks, so it is the first host
    places = assign_places(["hostB:1", "hostA:2", "hostB:3"])
    assert [(p.partition, p.host, p.rank, p.local_rank, p.local_size, p.cross_rank, p.cross_size)
            for p in places] == [(0, "hostB", 0, 0, 2, 0, 2), (1, "hostA", 2, 0, 1, 1, 2),
                                 (2, "hostB", 1, 1, 2, 0, 1)]
    assert {p.size for p in places} == {3}


def test_even_hosts_keep_the_order_of_their_first_partition() -> None:
    places = assign_places(["hostA:1", "hostB:1", "hostA:2", "hostB:2"])
    assert [(p.rank, p.host, p.local_rank, p.cross_rank, p.cross_size) for p in places] == [
        (0, "hostA", 0, 0, 2), (2, "hostB", 0, 1, 2), (1, "hostA", 1, 0, 2), (3, "hostB", 1, 1, 2)]


def test_rank_environ_points_at_the_store_and_keeps_the_callers_env_below_its_own() -> None:
    place = assign_places(["hostA:1", "hostB:1"])[1]
    env = rank_environ(place, "10.0.0.1:4321", 45, attempt=7, extra={"RANK": "9", "NCCL_DEBUG": "INFO"})
    assert env["RANK"] == env["HOROVOD_RANK"] == "1"
    assert env["WORLD_SIZE"] == env["HOROVOD_SIZE"] == "2"
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert (env["CROSS_RANK"], env["CROSS_SIZE"]) == ("1", "2")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RINGTRAIN_JOB_STORE"]) == ("10.0.0.1", "4321",
                                                                                     "10.0.0.1:4321")
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert env["RINGTRAIN_ATTEMPT"] == "7"
    assert env["HOROVOD_HOSTNAME"] == "hostB"
    assert env["NCCL_DEBUG"] == "INFO"
    assert "GROUP_WORLD_SIZE" not in env
    assert "RINGTRAIN_JOB_SECRET" not in env
