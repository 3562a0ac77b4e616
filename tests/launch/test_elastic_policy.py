"""The elastic driver's failure policy (launch/elastic_policy.py): every decision, from plain data.

No process, no clock, no store: each table row is what the driver saw and what it must do.
"""

from __future__ import annotations

import signal

import pytest

from ringtrain.exceptions import UsageError
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.elastic_hosts import Survivor
from ringtrain.launch.elastic_policy import (
    DEFAULT_ELASTIC_TIMEOUT,
    Action,
    Cause,
    Decision,
    ElasticPolicy,
    ElasticSettings,
    HostAction,
    WorkerEnd,
)
from ringtrain.launch.elastic_worker import UNREACHABLE_EXIT

HOSTS = "usable hosts: a:1"
SOURCE = "-H/--hostfile"


def policy(num_proc: int = 2, min_np: int = 1, max_np: int | None = 2, timeout: float = 3.0,
           reset_limit: int | None = None, start_timeout: float = 30.0) -> ElasticPolicy:
    settings = ElasticSettings(num_proc=num_proc, min_np=min_np, max_np=max_np, timeout=timeout,
                               reset_limit=reset_limit, cooldown_range=None, failures_to_blacklist=2)
    return ElasticPolicy(settings, start_timeout=start_timeout)


def survivor(wid: str, host: str, rank: int, local_rank: int = 0) -> Survivor:
    return Survivor(wid, host, local_rank, rank)


# --- a worker's failure: why, and what it does to its host ------------------------------------------
@pytest.mark.parametrize(("end", "cause", "host"), [
    # its own exit code or signal: one more failed generation for its host
    (WorkerEnd(code=-9, reached_store=True), Cause.EXITED, HostAction.COUNT_FAILURE),
    (WorkerEnd(code=3, reached_store=True), Cause.EXITED, HostAction.COUNT_FAILURE),
    # a second failure on the same host in the same generation counts once
    (WorkerEnd(code=-9, reached_store=True, host_failed_already=True), Cause.EXITED, HostAction.NONE),
    # the heartbeats gave it up: a failure like any other, told as the lost contact
    (WorkerEnd(code=-9, reached_store=True, lost_heartbeat=True), Cause.LOST_HEARTBEAT,
     HostAction.COUNT_FAILURE),
    # ssh's keep-alives (or a lost Ray actor) gave up the host
    (WorkerEnd(code=255, reached_store=True, unreachable=True, lost_contact=True), Cause.LOST_CONTACT,
     HostAction.COUNT_FAILURE),
    # never reached the job store: the host cannot run workers at all, blacklisted at once
    (WorkerEnd(code=UNREACHABLE_EXIT, reached_store=False), Cause.NO_JOB_STORE, HostAction.BLACKLIST),
    (WorkerEnd(code=UNREACHABLE_EXIT, reached_store=False, host_failed_already=True), Cause.NO_JOB_STORE,
     HostAction.BLACKLIST),
    # its place could not start it (ssh exit 255 before the store heard of it, a Ray actor not started)
    (WorkerEnd(code=255, reached_store=False, unreachable=True), Cause.NOT_STARTED, HostAction.BLACKLIST),
    # ... and a lost heartbeat is what it is told as, the host still blacklisted at once
    (WorkerEnd(code=255, reached_store=False, unreachable=True, lost_heartbeat=True), Cause.LOST_HEARTBEAT,
     HostAction.BLACKLIST),
    # the unreachable exit code from a worker that did reach the store is its own exit code
    (WorkerEnd(code=UNREACHABLE_EXIT, reached_store=True), Cause.EXITED, HostAction.COUNT_FAILURE),
    # an exit that is no transport's problem, from a worker that never reached the store
    (WorkerEnd(code=1, reached_store=False), Cause.EXITED, HostAction.COUNT_FAILURE),
])
def test_a_failure_is_told_and_counted_against_its_host(end: WorkerEnd, cause: Cause,
                                                        host: HostAction) -> None:
    verdict = policy().judge_failure(end)
    assert (verdict.cause, verdict.host) == (cause, host)


# --- waiting for a generation ---------------------------------------------------------------------
TIMEOUT_FIRST = ("only 1 slot(s) usable, fewer than the 2 needed (-np 2), for --elastic-timeout 3 s "
                 f"({HOSTS}; hosts from {SOURCE}). HINT: add hosts or slots, lower --min-np, or raise "
                 "--elastic-timeout.")
TIMEOUT_AGAIN = TIMEOUT_FIRST.replace("the 2 needed (-np 2)", "the 2 needed (--min-np 2)")
NOBODY_PLACED = ("no surviving worker has a slot in the next generation, so nobody holds the committed "
                 f"state to broadcast ({HOSTS}). HINT: raise --max-np, or keep the hosts of the running "
                 "workers in the discovery output.")
NO_STATE = "every worker failed, so no state is left to go on from"


@pytest.mark.parametrize(("case", "first", "min_np", "survivors", "available", "waited", "action",
                          "reason"), [
    ("first, enough slots", True, 1, [], [("a", 1), ("b", 1)], 0.0, Action.FORM, ""),
    ("first, too few, within the timeout", True, 1, [], [("a", 1)], 3.0, Action.WAIT_FOR_HOSTS, ""),
    ("first, too few, timed out", True, 1, [], [("a", 1)], 3.5, Action.GIVE_UP, TIMEOUT_FIRST),
    ("first, no host at all", True, 1, [], [], 0.0, Action.WAIT_FOR_HOSTS, ""),
    ("again, no survivor", False, 1, [], [("a", 1), ("b", 1)], 0.0, Action.GIVE_UP, NO_STATE),
    ("again, no survivor, no host", False, 1, [], [], 10.0, Action.GIVE_UP, NO_STATE),
    ("again, min-np slots", False, 1, [survivor("w1", "a", 0)], [("a", 1)], 0.0, Action.FORM, ""),
    ("again, below min-np, within", False, 2, [survivor("w1", "a", 0)], [("a", 1)], 1.0,
     Action.WAIT_FOR_HOSTS, ""),
    ("again, below min-np, timed out", False, 2, [survivor("w1", "a", 0)], [("a", 1)], 4.0, Action.GIVE_UP,
     TIMEOUT_AGAIN),
    ("again, the survivor's host gone", False, 1, [survivor("w2", "b", 1)], [("a", 1)], 0.0, Action.GIVE_UP,
     NOBODY_PLACED),
])
def test_formation(case: str, first: bool, min_np: int, survivors: list[Survivor],
                   available: list[tuple[str, int]], waited: float, action: Action, reason: str) -> None:
    decision = policy(min_np=min_np).formation(first=first, survivors=survivors, available=available,
                                               waited=waited, hosts=HOSTS, source=SOURCE)
    assert decision.action is action, case
    assert decision.reason == reason, case
    assert decision.exit_code == (1 if action is Action.GIVE_UP else None), case
    assert bool(decision.plan) == (action is Action.FORM), case


def test_a_formed_generation_keeps_its_survivors_first_and_fills_the_free_slots() -> None:
    decision = policy(max_np=3).formation(first=False, survivors=[survivor("w2", "b", 1)],
                                          available=[("a", 1), ("b", 1), ("c", 2)], waited=0.0,
                                          hosts=HOSTS, source=SOURCE)
    assert [(wid, slot.hostname, slot.rank) for wid, slot in decision.plan] == [
        ("w2", "b", 0), (None, "a", 1), (None, "c", 2)]  # --max-np 3 leaves c's second slot out


# --- a broken generation that every member left ---------------------------------------------------
LIMIT_0 = ("the group broke again after --reset-limit 0 re-formation(s). HINT: raise --reset-limit, or look "
           "at the root cause below.")


@pytest.mark.parametrize(("reset_limit", "resets", "failed", "expected"), [
    (None, 0, 1, Decision(Action.RE_FORM, reset=1, after_failure=True)),
    (None, 41, 0, Decision(Action.RE_FORM, reset=42, after_failure=False)),  # for changed hosts
    (2, 1, 2, Decision(Action.RE_FORM, reset=2, after_failure=True)),
    (0, 0, 1, Decision(Action.GIVE_UP, reason=LIMIT_0, exit_code=1)),
    (0, 0, 0, Decision(Action.GIVE_UP, reason=LIMIT_0, exit_code=1)),  # a host change counts too
    (2, 2, 1, Decision(Action.GIVE_UP, reason=LIMIT_0.replace("limit 0", "limit 2"), exit_code=1)),
])
def test_after_a_break(reset_limit: int | None, resets: int, failed: int, expected: Decision) -> None:
    assert policy(reset_limit=reset_limit).after_break(resets=resets, failed=failed) == expected


# --- a member finished ----------------------------------------------------------------------------
@pytest.mark.parametrize(("codes", "left", "expected"), [
    ({"w1": 0, "w2": None}, set(), Decision(Action.WAIT_FOR_EXITS)),
    # w2 waits for a next generation that will not come: told to stop
    ({"w1": 0, "w2": None}, {"w2"}, Decision(Action.WAIT_FOR_EXITS, stop_waiting=True)),
    ({"w1": 0, "w2": None, "w3": 0}, {"w3"}, Decision(Action.WAIT_FOR_EXITS)),  # w3 left, then ended
    ({"w1": 0, "w2": 0}, {"w2"}, Decision(Action.FINISH, exit_code=0)),
    ({"w1": 0}, set(), Decision(Action.FINISH, exit_code=0)),
    ({"w1": 0, "w2": -9}, set(), Decision(Action.GIVE_UP, reason="", exit_code=1)),
])
def test_ending(codes: dict[str, int | None], left: set[str], expected: Decision) -> None:
    assert policy().ending(codes, left) == expected


# --- a stop signal, and the bounds ----------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_ends_with_128_plus_its_number(signum: int) -> None:
    assert policy().on_stop(signum) == Decision(Action.STOP, exit_code=128 + signum)


@pytest.mark.parametrize(("broken_for", "overdue"), [(0.0, False), (3.0, False), (3.01, True)])
def test_a_member_is_overdue_leaving_after_the_elastic_timeout(broken_for: float, overdue: bool) -> None:
    assert policy(timeout=3.0).overdue_leaving(broken_for) is overdue


@pytest.mark.parametrize(("formed_for", "overdue"), [(32.0, False), (33.0, False), (33.5, True)])
def test_a_member_is_overdue_joining_after_start_plus_elastic_timeout(formed_for: float,
                                                                      overdue: bool) -> None:
    assert policy(timeout=3.0, start_timeout=30.0).overdue_joining(formed_for) is overdue


# --- the settings the policy decides with ---------------------------------------------------------
def test_settings_resolve_their_defaults() -> None:
    settings = ElasticSettings.from_config(LaunchConfig(command=("x",), min_np=2), {})
    assert settings == ElasticSettings(num_proc=2, min_np=2, max_np=None, timeout=DEFAULT_ELASTIC_TIMEOUT,
                                       reset_limit=None, cooldown_range=None, failures_to_blacklist=2)
    settings = ElasticSettings.from_config(
        LaunchConfig(command=("x",), num_proc=3, min_np=1, max_np=4, reset_limit=1, cooldown_range=(1, 2)),
        {"HOROVOD_ELASTIC_TIMEOUT": "7", "RINGTRAIN_ELASTIC_FAILURES_TO_BLACKLIST": "1"})
    assert settings == ElasticSettings(num_proc=3, min_np=1, max_np=4, timeout=7.0, reset_limit=1,
                                       cooldown_range=(1, 2), failures_to_blacklist=1)


@pytest.mark.parametrize(("name", "text"), [
    ("HOROVOD_ELASTIC_TIMEOUT", "-1"), ("HOROVOD_ELASTIC_TIMEOUT", "x"), ("HOROVOD_ELASTIC_TIMEOUT", "inf"),
    ("RINGTRAIN_ELASTIC_FAILURES_TO_BLACKLIST", "0")])
def test_bad_numbers_in_the_environment_are_usage_errors(name: str, text: str) -> None:
    with pytest.raises(UsageError, match=f"{name}='{text}' is not a number of"):
        ElasticSettings.from_config(LaunchConfig(command=("x",), min_np=1), {name: text})
