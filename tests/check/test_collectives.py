"""``ringtrain.check.collectives`` in one process: every check against a stand-in API that is right, wrong,
partial or broken, so that each way a collective can go wrong is shown to be caught and described.
(Real ranks run the same checks in tests/cli/test_check.py.)"""

from __future__ import annotations

import pytest

from ringtrain.check.collectives import (
    check_allreduce,
    check_alltoall,
    check_barrier,
    check_broadcast,
    count_failures_everywhere,
    measure_allreduce_bandwidth,
    run_collective_checks,
)
from tests.check.stand_in import CPU, world_of_one


def names(results):
    return [r.name for r in results]


def test_a_correct_api_passes_every_check():
    results = run_collective_checks(world_of_one(), CPU)
    assert [r for r in results if not r.ok] == []
    assert names(results) == [
        "allreduce[sum]", "allreduce[average]", "allreduce[min]", "allreduce[max]", "allreduce[product]",
        "allreduce[adasum]", "allreduce[int64]", "allreduce[large]", "allgather[uneven]", "broadcast[root=0]",
        "alltoall[equal]", "alltoall[splits]", "reducescatter[sum]", "reducescatter[average]", "barrier"]


def test_progress_hears_every_check_before_it_runs():
    heard = []
    run_collective_checks(world_of_one(), CPU, progress=heard.append)
    assert heard[:2] == ["allreduce[sum]", "allreduce[average]"]
    assert heard[-1] == "barrier"
    assert len(heard) == 14  # alltoall is one step with two results


def test_an_api_that_does_not_communicate_fails_with_the_first_wrong_value():
    api = world_of_one()
    api.size = lambda: 2  # two ranks, but nothing is exchanged: every rank keeps its own input
    results = {r.name: r for r in run_collective_checks(api, CPU)}
    total = results["allreduce[sum]"]
    assert not total.ok
    # rank 0 sends (i % 7) and rank 1 (i % 7) + 1, so the sum at index 0 is 1
    assert total.detail == "33 of 33 values wrong; first at index (0,): got 0.0, expected 1.0"
    assert results["allreduce[int64]"].detail.startswith("got [1099511627776, 0] (torch.int64), expected")
    assert results["allgather[uneven]"].detail == "shape (1, 3), expected (3, 3)"
    assert results["barrier"].ok


def test_a_collective_that_writes_into_its_input_is_caught():
    api = world_of_one()

    def overwrite(tensor, root, name=None):
        result = tensor.clone()
        tensor.zero_()
        return result

    api.broadcast = overwrite
    result = check_broadcast(api, CPU)
    assert not result.ok
    assert result.detail == "broadcast changed its input tensor (it must be out-of-place)"


def test_an_op_the_api_declines_is_skipped_not_failed():
    api = world_of_one()

    def allreduce(tensor, name=None, op=None):
        if op == "adasum":
            raise NotImplementedError("Adasum needs a power-of-two world")
        return tensor.clone()

    api.allreduce = allreduce
    result = check_allreduce(api, "Adasum", CPU)
    assert (result.ok, result.skipped) == (True, True)
    assert "Adasum needs a power-of-two world" in result.detail


def test_a_check_that_raises_is_a_failure_that_names_the_error():
    api = world_of_one()

    def broken(tensor, name=None):
        raise RuntimeError("peer 1 went away")

    api.allgather = broken
    results = {r.name: r for r in run_collective_checks(api, CPU)}
    assert results["allgather[uneven]"].detail == "raised RuntimeError: peer 1 went away"
    assert results["barrier"].ok  # the others still ran


def test_alltoall_with_splits_must_return_the_received_splits():
    api = world_of_one()
    api.alltoall = lambda tensor, splits=None, name=None: tensor.clone()
    split = check_alltoall(api, CPU)[1]
    assert not split.ok
    assert split.detail == "returned Tensor, expected (output, received_splits)"


def test_barrier_must_return_none():
    api = world_of_one()
    api.barrier = lambda: 0
    assert check_barrier(api).detail == "returned 0, expected None"


def test_the_verdict_counts_a_broken_reduction_as_one_more_failure():
    api = world_of_one()
    api.size = lambda: 2
    api.allreduce = lambda tensor, name=None, op=None: tensor * 2  # pretends a second rank sent the same
    assert count_failures_everywhere(api, 3) == 6

    def broken(tensor, name=None, op=None):
        raise RuntimeError("gone")

    api.allreduce = broken
    assert count_failures_everywhere(api, 3) == 4


def test_bandwidth_sample_per_size():
    samples = measure_allreduce_bandwidth(world_of_one(), CPU, sizes=(4096, 10), iterations=3)
    assert [s.nbytes for s in samples] == [4096, 8]  # whole float32 elements, at least one
    for s in samples:
        assert s.seconds > 0
        assert s.algbw_mbps == pytest.approx(s.nbytes / s.seconds / 1e6)
        assert s.busbw_mbps == 0.0  # a world of one moves nothing between ranks
