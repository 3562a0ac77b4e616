"""``ringtrain.check.hosts`` and the host grouping of ``ringtrain.check.report``, from rank sites made by
hand (real ranks on several hosts run them in tests/cli/test_check.py)."""

from __future__ import annotations

import pytest

from ringtrain.check.hosts import ALL_PAIRS_MAX_HOSTS, host_warnings, link_pairs, reached_on
from ringtrain.check.report import summarize_hosts
from tests.check.stand_in import VERSIONS, site


def test_a_rank_is_reached_on_the_addresses_other_hosts_saw():
    sites = [site(0, "a", {1: "127.0.0.1", 2: "10.0.0.2"}), site(1, "a", {0: "127.0.0.1", 2: "10.0.0.2"}),
             site(2, "b", {0: "10.0.0.1", 1: "10.0.0.1"})]
    assert reached_on(sites, 0) == ["10.0.0.1"]  # loopback from its own host does not count
    assert reached_on(sites, 2) == ["10.0.0.2"]


def test_same_versions_and_clocks_give_no_warning():
    assert host_warnings([site(0, "a"), site(1, "b", clock=0.2)]) == []


@pytest.mark.parametrize("package", ["ringtrain", "torch", "python"])
def test_versions_that_differ_between_hosts_are_a_warning_naming_each(package):
    (warning,) = host_warnings([site(0, "a"), site(1, "b", **{package: "9.9.9"})])
    assert warning.startswith(f"{package} versions differ between ranks: ")
    assert f"{VERSIONS[package]} on a (rank 0)" in warning
    assert "9.9.9 on b (rank 1)" in warning
    assert "HINT:" in warning


def test_a_clock_far_off_is_a_warning():
    (warning,) = host_warnings([site(0, "a"), site(1, "b", clock=-42.0)])
    assert "clocks differ from a's by b -42.0 s" in warning
    assert "HINT: run an NTP client" in warning


def test_links_pair_every_host_up_to_a_limit_then_go_from_the_first():
    few = summarize_hosts([site(r, f"h{r}") for r in range(3)])
    assert [(a.host, b.host) for a, b in link_pairs(few)] == [("h0", "h1"), ("h0", "h2"), ("h1", "h2")]
    many = summarize_hosts([site(r, f"h{r}") for r in range(ALL_PAIRS_MAX_HOSTS + 1)])
    assert [b.host for a, b in link_pairs(many)] == [f"h{r}" for r in range(1, len(many))]
