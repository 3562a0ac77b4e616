"""``ringtrain.checks`` in one process: every check against a stand-in API that is right, wrong, partial
or broken, so that each way a collective can go wrong is shown to be caught and described.
(Real ranks run the same checks in tests/cli/test_check.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import ringtrain
from ringtrain import checks

CPU = torch.device("cpu")


def world_of_one() -> SimpleNamespace:
    """A correct API for a world of one process: every collective returns (a copy of) its input."""

    def alltoall(tensor, splits=None, name=None):
        if splits is None:
            return tensor.clone()
        return tensor.clone(), torch.tensor(list(splits))

    return SimpleNamespace(
        rank=lambda: 0, size=lambda: 1, local_rank=lambda: 0,
        Sum="sum", Average="average", Min="min", Max="max", Product="product", Adasum="adasum",
        allreduce=lambda tensor, name=None, op=None: tensor.clone(),
        allgather=lambda tensor, name=None: tensor.clone(),
        broadcast=lambda tensor, root, name=None: tensor.clone(),
        alltoall=alltoall,
        reducescatter=lambda tensor, name=None, op=None: tensor.clone(),
        barrier=lambda: None,
    )


def names(results):
    return [r.name for r in results]


def test_load_api_is_the_package():
    assert checks.load_api() is ringtrain
    assert callable(checks.load_api().allreduce)


def test_a_correct_api_passes_every_check():
    results = checks.run_collective_checks(world_of_one(), CPU)
    assert [r for r in results if not r.ok] == []
    assert names(results) == [
        "allreduce[sum]", "allreduce[average]", "allreduce[min]", "allreduce[max]", "allreduce[product]",
        "allreduce[adasum]", "allreduce[int64]", "allreduce[large]", "allgather[uneven]", "broadcast[root=0]",
        "alltoall[equal]", "alltoall[splits]", "reducescatter[sum]", "reducescatter[average]", "barrier"]


def test_progress_hears_every_check_before_it_runs():
    heard = []
    checks.run_collective_checks(world_of_one(), CPU, progress=heard.append)
    assert heard[:2] == ["allreduce[sum]", "allreduce[average]"]
    assert heard[-1] == "barrier"
    assert len(heard) == 14  # alltoall is one step with two results


def test_an_api_that_does_not_communicate_fails_with_the_first_wrong_value():
    api = world_of_one()
    api.size = lambda: 2  # two ranks, but nothing is exchanged: every rank keeps its own input
    results = {r.name: r for r in checks.run_collective_checks(api, CPU)}
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
    result = checks.check_broadcast(api, CPU)
    assert not result.ok
    assert result.detail == "broadcast changed its input tensor (it must be out-of-place)"


def test_an_op_the_api_declines_is_skipped_not_failed():
    api = world_of_one()

    def allreduce(tensor, name=None, op=None):
        if op == "adasum":
            raise NotImplementedError("Adasum needs a power-of-two world")
        return tensor.clone()

    api.allreduce = allreduce
    result = checks.check_allreduce(api, "Adasum", CPU)
    assert (result.ok, result.skipped) == (True, True)
    assert "Adasum needs a power-of-two world" in result.detail


def test_a_check_that_raises_is_a_failure_that_names_the_error():
    api = world_of_one()

    def broken(tensor, name=None):
        raise RuntimeError("peer 1 went away")

    api.allgather = broken
    results = {r.name: r for r in checks.run_collective_checks(api, CPU)}
    assert results["allgather[uneven]"].detail == "raised RuntimeError: peer 1 went away"
    assert results["barrier"].ok  # the others still ran


def test_alltoall_with_splits_must_return_the_received_splits():
    api = world_of_one()
    api.alltoall = lambda tensor, splits=None, name=None: tensor.clone()
    split = checks.check_alltoall(api, CPU)[1]
    assert not split.ok
    assert split.detail == "returned Tensor, expected (output, received_splits)"


def test_barrier_must_return_none():
    api = world_of_one()
    api.barrier = lambda: 0
    assert checks.check_barrier(api).detail == "returned 0, expected None"


def test_the_verdict_counts_a_broken_reduction_as_one_more_failure():
    api = world_of_one()
    api.size = lambda: 2
    api.allreduce = lambda tensor, name=None, op=None: tensor * 2  # pretends a second rank sent the same
    assert checks.count_failures_everywhere(api, 3) == 6

    def broken(tensor, name=None, op=None):
        raise RuntimeError("gone")

    api.allreduce = broken
    assert checks.count_failures_everywhere(api, 3) == 4


def test_bandwidth_sample_per_size():
    samples = checks.measure_allreduce_bandwidth(world_of_one(), CPU, sizes=(4096, 10), iterations=3)
    assert [s.nbytes for s in samples] == [4096, 8]  # whole float32 elements, at least one
    for s in samples:
        assert s.seconds > 0
        assert s.algbw_mbps == pytest.approx(s.nbytes / s.seconds / 1e6)
        assert s.busbw_mbps == 0.0  # a world of one moves nothing between ranks


def test_report_verdict_and_json_view():
    report = checks.new_report(world_of_one(), CPU, "single")
    assert (report.rank, report.size, report.environment, report.device) == (0, 1, "single", "cpu")
    assert report.backends["gloo"] is True
    assert report.control_plane == "none (one process)"
    assert report.ok
    report.results += [checks.CheckResult("a", True), checks.CheckResult("b", False, "wrong"),
                       checks.CheckResult("c", True, "declined", skipped=True)]
    assert [r.name for r in report.failures] == ["b"]
    assert not report.ok
    data = report.to_dict()
    assert data["ok"] is False
    assert data["results"][1] == {"name": "b", "ok": False, "detail": "wrong", "skipped": False}
    assert checks.hello_line(report).startswith("hello from rank 0 of 1 (host ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_pick_device_without_cuda():
    assert checks.pick_device("auto", 0) == CPU
    assert checks.pick_device("cpu", 5) == CPU
    with pytest.raises(ValueError, match="--device cuda was asked for but torch sees no CUDA device. HINT:"):
        checks.pick_device("cuda", 0)


# --- across hosts -------------------------------------------------------------------------------

VERSIONS = {"ringtrain": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}


def site(rank, host, peers=None, clock=0.0, **versions):
    return checks.RankSite(rank=rank, host=host, interfaces=(("lo", "127.0.0.1"), ("eth0", f"10.0.0.{rank}")),
                           peers=peers or {}, clock_offset=clock, versions={**VERSIONS, **versions})


def test_hosts_group_ranks_in_order_of_first_appearance():
    sites = [site(0, "a"), site(1, "a"), site(2, "b"), site(3, "a")]
    hosts = checks.summarize_hosts(sites)
    assert [(h.host, h.ranks) for h in hosts] == [("a", (0, 1, 3)), ("b", (2,))]


def test_a_rank_is_reached_on_the_addresses_other_hosts_saw():
    sites = [site(0, "a", {1: "127.0.0.1", 2: "10.0.0.2"}), site(1, "a", {0: "127.0.0.1", 2: "10.0.0.2"}),
             site(2, "b", {0: "10.0.0.1", 1: "10.0.0.1"})]
    assert checks.reached_on(sites, 0) == ["10.0.0.1"]  # loopback from its own host does not count
    assert checks.reached_on(sites, 2) == ["10.0.0.2"]


def test_same_versions_and_clocks_give_no_warning():
    assert checks.host_warnings([site(0, "a"), site(1, "b", clock=0.2)]) == []


@pytest.mark.parametrize("package", ["ringtrain", "torch", "python"])
def test_versions_that_differ_between_hosts_are_a_warning_naming_each(package):
    (warning,) = checks.host_warnings([site(0, "a"), site(1, "b", **{package: "9.9.9"})])
    assert warning.startswith(f"{package} versions differ between ranks: ")
    assert f"{VERSIONS[package]} on a (rank 0)" in warning
    assert "9.9.9 on b (rank 1)" in warning
    assert "HINT:" in warning


def test_a_clock_far_off_is_a_warning():
    (warning,) = checks.host_warnings([site(0, "a"), site(1, "b", clock=-42.0)])
    assert "clocks differ from a's by b -42.0 s" in warning
    assert "HINT: run an NTP client" in warning


def test_links_pair_every_host_up_to_a_limit_then_go_from_the_first():
    few = checks.summarize_hosts([site(r, f"h{r}") for r in range(3)])
    assert [(a.host, b.host) for a, b in checks.link_pairs(few)] == [("h0", "h1"), ("h0", "h2"), ("h1", "h2")]
    many = checks.summarize_hosts([site(r, f"h{r}") for r in range(checks.ALL_PAIRS_MAX_HOSTS + 1)])
    assert [b.host for a, b in checks.link_pairs(many)] == [f"h{r}" for r in range(1, len(many))]


def test_interfaces_include_loopback():
    assert ("lo", "127.0.0.1") in checks.interface_addresses()
