"""Ranks grouped by Ray node, and the environment each rank gets (no Ray cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray.ranks import WorkerNode, assign_ranks, places_of_ranks, worker_environ

A, B, C = (WorkerNode(f"node{n}", f"10.0.0.{n}", f"host{n}") for n in (1, 2, 3))


def test_ranks_are_grouped_by_node_in_creation_order() -> None:
    places = assign_ranks([A, B, A, B])
    assert [p.worker for p in places] == [0, 2, 1, 3]
    assert [(p.rank, p.local_rank, p.local_size, p.node_rank) for p in places] == [
        (0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 2, 1), (3, 1, 2, 1)]
    assert [p.node for p in places] == [A, A, B, B]
    assert all(p.size == 4 and p.cross_size == 2 for p in places)
    assert [p.cross_rank for p in places] == [0, 0, 1, 1]


def test_uneven_nodes_get_horovods_cross_rank_and_size() -> None:
    # B holds three workers, A one, C two: B goes first, then C, then A
    places = assign_ranks([A, B, B, C, B, C])
    assert [p.node.node_id for p in places] == ["node2"] * 3 + ["node3"] * 2 + ["node1"]
    by_rank = {p.rank: p for p in places}
    # local rank 0 lives on all three nodes, local rank 1 on B and C, local rank 2 on B alone
    assert [(by_rank[r].local_rank, by_rank[r].cross_rank, by_rank[r].cross_size) for r in range(6)] == [
        (0, 0, 3), (1, 0, 2), (2, 0, 1), (0, 1, 3), (1, 1, 2), (0, 2, 3)]


def test_ranks_numbered_by_ray_train_keep_their_numbers() -> None:
    # Ray Train's worker i is rank i: B's three workers still come first among the nodes (cross rank 0)
    places = places_of_ranks([A, B, B, C, B, C])
    assert [p.rank for p in places] == [0, 1, 2, 3, 4, 5]
    assert [p.worker for p in places] == [0, 1, 2, 3, 4, 5]
    assert [(p.local_rank, p.local_size, p.cross_rank, p.cross_size) for p in places] == [
        (0, 1, 2, 3), (0, 3, 0, 3), (1, 3, 0, 2), (0, 2, 1, 3), (2, 3, 0, 1), (1, 2, 1, 2)]


def test_one_node() -> None:
    places = assign_ranks([A, A, A])
    assert [(p.rank, p.local_rank, p.local_size, p.cross_rank, p.cross_size) for p in places] == [
        (0, 0, 3, 0, 1), (1, 1, 3, 0, 1), (2, 2, 3, 0, 1)]


def test_environment_points_at_the_job_store_and_carries_both_families() -> None:
    place = assign_ranks([A, B, A, B])[3]
    env = worker_environ(place, "10.0.0.9:4000", 60, nics=("eth1",), extra={"FOO": 1, "MASTER_PORT": "5"})
    assert env["RINGTRAIN_JOB_STORE"] == "10.0.0.9:4000"
    assert env["MASTER_ADDR"] == "10.0.0.9"
    assert env["MASTER_PORT"] == "5"  # the user's extra_env_vars win
    assert (env["RANK"], env["WORLD_SIZE"]) == ("3", "4")
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert (env["GROUP_RANK"], env["CROSS_RANK"], env["CROSS_SIZE"]) == ("1", "1", "2")
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"]) == ("3", "4", "1")
    assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert env["HOROVOD_HOSTNAME"] == "host2"
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "60"
    assert env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["FOO"] == "1"
    assert "RINGTRAIN_JOB_SECRET" not in env  # the secret travels apart, as a Ray object
    assert "GROUP_WORLD_SIZE" not in env  # else the cross size would be read as the node count


def test_the_environment_is_what_the_engine_reads() -> None:
    from ringtrain.env import detect_environment

    places = assign_ranks([A, B, B])
    placement = detect_environment(worker_environ(places[2], "10.0.0.9:4000", 30)).placement()
    assert (placement.rank, placement.world_size) == (2, 3)
    assert (placement.local_rank, placement.local_world_size) == (0, 1)
    assert (placement.cross_rank, placement.cross_size, placement.node_rank) == (1, 2, 1)
    assert placement.main_address == "10.0.0.9"
