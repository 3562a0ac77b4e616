"""Ranks grouped by node: local ranks, node ranks and Horovod's cross rank and size."""

from __future__ import annotations

from ringtrain.engine.placement import Place, busiest_first, places_by_node


def table(places: list[Place]) -> list[tuple[int, ...]]:
    return [(p.member, p.rank, p.local_rank, p.local_size, p.node_rank, p.cross_rank, p.cross_size)
            for p in places]


def test_even_nodes_number_node_after_node() -> None:
    assert table(places_by_node([[0, 1], [2, 3]])) == [
        (0, 0, 0, 2, 0, 0, 2), (1, 1, 1, 2, 0, 0, 2),
        (2, 2, 0, 2, 1, 1, 2), (3, 3, 1, 2, 1, 1, 2)]


def test_uneven_nodes_count_only_the_nodes_that_hold_a_local_rank() -> None:
    # node 1 holds one member: local rank 1 and 2 live on nodes 0 and 2 only
    places = places_by_node([[0, 1, 2], [3], [4, 5]])
    assert [(p.local_rank, p.node_rank, p.cross_rank, p.cross_size) for p in places] == [
        (0, 0, 0, 3), (1, 0, 0, 2), (2, 0, 0, 1), (0, 1, 1, 3), (0, 2, 2, 3), (1, 2, 1, 2)]


def test_members_keep_the_callers_index() -> None:
    assert [(p.member, p.rank) for p in places_by_node([[2, 0], [1]])] == [(2, 0), (0, 1), (1, 2)]


def test_no_nodes_no_places() -> None:
    assert places_by_node([]) == []


def test_busiest_first_orders_by_size_then_first_index() -> None:
    assert busiest_first(["b", "a", "b", "c", "a", "a"]) == [[1, 4, 5], [0, 2], [3]]
    assert busiest_first(["x", "y"]) == [[0], [1]]  # a tie: the node of the lowest index first


def test_busiest_first_makes_the_cross_rank_the_node_rank() -> None:
    keys = ["n1", "n2", "n2", "n3", "n2", "n3"]
    assert all(p.cross_rank == p.node_rank for p in places_by_node(busiest_first(keys)))
