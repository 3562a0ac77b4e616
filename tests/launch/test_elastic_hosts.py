"""Hosts of an elastic job: discovery output, the discovery script, failures, blacklist and cooldown,
and the placement of each generation's workers."""

from __future__ import annotations

import pytest

from ringtrain.engine.elastic_rendezvous import Slot
from ringtrain.exceptions import UsageError
from ringtrain.launch.elastic_hosts import (
    DiscoveryError,
    FixedHosts,
    HostRegistry,
    ScriptDiscovery,
    Survivor,
    check_cooldown_range,
    parse_discovery_output,
    plan_generation,
)


@pytest.mark.parametrize(("text", "default", "hosts"), [
    ("node1:4\nnode2:2\n", None, {"node1": 4, "node2": 2}),
    ("  node1:4  \n\n# a comment\nnode2:1 # trailing\n", None, {"node1": 4, "node2": 1}),
    ("node1\nnode2:3\n", 2, {"node1": 2, "node2": 3}),
    ("10.0.0.1:2\nnode-a.cluster:1\n", None, {"10.0.0.1": 2, "node-a.cluster": 1}),
    ("", None, {}),
    ("node1:2\nnode1:2\n", None, {"node1": 2}),
])
def test_discovery_output(text, default, hosts):
    assert parse_discovery_output(text, default, "script") == hosts


@pytest.mark.parametrize(("text", "default", "needle"), [
    ("node1\n", None, "gives no slot count and --slots-per-host was not given"),
    ("node1:0\n", None, "has no valid slot count"),
    ("node1:x\n", None, "has no valid slot count"),
    ("bad host:2\n", None, "is not 'host' or 'host:slots'"),
    ("node1:2\nnode1:3\n", None, "twice with different slots"),
])
def test_bad_discovery_output_names_the_line(text, default, needle):
    with pytest.raises(DiscoveryError, match=needle) as info:
        parse_discovery_output(text, default, "script")
    assert "HINT:" in str(info.value)


def test_discovery_script_runs_through_the_shell(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho hostA:2\necho hostB\n")
    script.chmod(0o755)
    assert ScriptDiscovery(str(script), 1).find() == {"hostA": 2, "hostB": 1}
    assert ScriptDiscovery(f"{script} --ignored-argument", 1).find() == {"hostA": 2, "hostB": 1}


def test_failing_or_missing_discovery_script_is_reported(tmp_path):
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho oops >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(DiscoveryError, match="exited with code 3: oops"):
        ScriptDiscovery(str(script), None).find()
    plain = tmp_path / "not-executable.sh"
    plain.write_text("echo a:1\n")
    with pytest.raises(DiscoveryError, match="chmod"):
        ScriptDiscovery(str(plain), None).find()


def test_slow_discovery_script_times_out(tmp_path):
    with pytest.raises(DiscoveryError, match="did not finish within 0.5 s"):
        ScriptDiscovery("sleep 30", None, timeout=0.5).find()


def test_fixed_hosts():
    assert FixedHosts({"a": 2}, "-H").find() == {"a": 2}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(**kwargs) -> tuple[HostRegistry, Clock]:
    clock = Clock()
    reg = HostRegistry(clock=clock, rng=lambda: 0.5, **kwargs)
    return reg, clock


def test_hosts_keep_the_order_they_were_first_seen_in():
    reg, _ = registry()
    assert reg.update({"b": 1, "a": 2})
    assert not reg.update({"b": 1, "a": 2})
    assert reg.update({"c": 1, "a": 2})
    assert reg.available() == [("a", 2), ("c", 1)]
    reg.update({"a": 2, "b": 4, "c": 1})
    assert reg.available() == [("b", 4), ("a", 2), ("c", 1)]


def test_a_host_is_blacklisted_at_its_second_failed_generation_for_good_without_cooldown():
    reg, clock = registry()
    reg.update({"a": 1, "b": 1})
    version = reg.version
    assert not reg.record_failure("b", "worker w2: killed by SIGKILL")
    assert reg.available() == [("a", 1), ("b", 1)]
    assert reg.record_failure("b", "worker w3: exit code 1")
    assert reg.version > version
    assert reg.available() == [("a", 1)]
    clock.now += 10 ** 6
    assert reg.refresh() == []
    assert reg.is_blacklisted("b")
    assert "blacklisted: b for good (no --blacklist-cooldown-range): worker w3: exit code 1 (2 failures)" \
        in reg.describe()


def test_failures_to_blacklist_one_is_horovods_rule():
    reg, _ = registry(failures_to_blacklist=1)
    reg.update({"a": 1})
    assert reg.record_failure("a", "crash")


def test_cooldown_doubles_from_min_plus_a_random_fraction_and_stops_at_max():
    reg, clock = registry(cooldown_range=(10, 100))
    reg.update({"a": 1, "b": 1})
    reg.record_failure("b", "x")
    reg.record_failure("b", "x")
    cooldowns = [reg.state("b").cooldown_until - clock.now]  # 10 * 2**0 + 0.5 * 10
    for _ in range(4):
        clock.now = reg.state("b").cooldown_until
        assert reg.refresh() == ["b"]
        assert reg.available() == [("a", 1), ("b", 1)]
        assert reg.record_failure("b", "x")  # one failure after a cooldown blacklists again
        cooldowns.append(reg.state("b").cooldown_until - clock.now)
    assert cooldowns == [15.0, 25.0, 45.0, 85.0, 100.0]
    assert "blacklisted: b for another 100 s" in reg.describe()


def test_a_host_that_cannot_start_a_worker_is_blacklisted_at_once():
    reg, _ = registry()
    reg.update({"a": 1, "b": 1})
    reg.record_unreachable("b", "worker w2 could not start there")
    assert reg.available() == [("a", 1)]


@pytest.mark.parametrize(("value", "ok"), [((1, 1), True), ((10, 3600), True), ((0, 10), False),
                                           ((5, 3601), False), ((20, 10), False)])
def test_cooldown_range_bounds(value, ok):
    if ok:
        assert check_cooldown_range(value) == value
    else:
        with pytest.raises(UsageError, match="HINT"):
            check_cooldown_range(value)


def slots(plan):
    return [(worker, s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, s.size)
            for worker, s in plan]


def test_first_generation_fills_hosts_in_order_with_horovods_cross_ranks():
    plan = plan_generation([("a", 2), ("b", 1)], [], None)
    assert slots(plan) == [(None, "a", 0, 0, 2, 0, 2, 3), (None, "a", 1, 1, 2, 0, 1, 3),
                           (None, "b", 2, 0, 1, 1, 2, 3)]


def test_max_np_caps_the_group():
    assert len(plan_generation([("a", 2), ("b", 2)], [], 3)) == 3
    assert [s.hostname for _, s in plan_generation([("a", 2), ("b", 2)], [], 1)] == ["a"]


def test_survivors_keep_their_slots_and_the_oldest_becomes_rank_0():
    # w1 (rank 0 on a, local rank 0) died; w2 (a[1]) and w3 (b[0]) survive.
    survivors = [Survivor("w2", "a", 1, 1), Survivor("w3", "b", 0, 2)]
    plan = plan_generation([("a", 2), ("b", 1)], survivors, None)
    assert slots(plan) == [("w2", "a", 0, 1, 2, 0, 1, 3), (None, "a", 1, 0, 2, 0, 2, 3),
                           ("w3", "b", 2, 0, 1, 1, 2, 3)]


def test_hosts_with_survivors_come_before_new_ones():
    survivors = [Survivor("w3", "c", 0, 0)]
    plan = plan_generation([("a", 1), ("b", 1), ("c", 1)], survivors, 2)
    assert [(w, s.hostname, s.rank) for w, s in plan] == [("w3", "c", 0), (None, "a", 1)]


def test_a_survivor_beyond_its_hosts_slots_is_left_out():
    plan = plan_generation([("a", 1)], [Survivor("w1", "a", 0, 0), Survivor("w2", "a", 1, 1)], None)
    assert [w for w, _ in plan] == ["w1"]


def test_slot_variables():
    slot = Slot("a", 2, 4, 1, 2, 0, 2)
    assert slot.horovod_variables() == {
        "HOROVOD_HOSTNAME": "a", "HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "2"}
