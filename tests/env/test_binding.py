"""RINGTRAIN_BIND=core: each rank of a host on a share of its own of the physical cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringtrain.env import binding
from ringtrain.env.binding import format_cpu_list, parse_cpu_list, physical_cores, share_of
from tests.processes import owns_two_or_more_cpus

# 4 physical cores with 2 hardware threads each, numbered as Linux does on most x86 hosts.
HT4 = [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_cpu_lists_in_the_kernels_format():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpu_list([5, 0, 1, 2, 10, 11]) == "0-2,5,10-11"
    assert format_cpu_list([3]) == "3"
    for bad in ("a-b", "3-1"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


def test_hardware_threads_are_grouped_by_physical_core(tmp_path):
    for cpu in range(8):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        topology.joinpath("thread_siblings_list").write_text(f"{cpu % 4},{cpu % 4 + 4}\n")
    assert physical_cores(range(8), tmp_path) == HT4
    # only the allowed CPUs count; one whose topology cannot be read is a core of its own
    assert physical_cores([0, 1, 4, 9], tmp_path) == [[0, 4], [1], [9]]


@pytest.mark.parametrize(("size", "shares"), [
    (1, [[0, 4, 1, 5, 2, 6, 3, 7]]),
    (2, [[0, 4, 1, 5], [2, 6, 3, 7]]),
    (3, [[0, 4, 1, 5], [2, 6], [3, 7]]),  # the first ranks take the core left over
    (4, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (6, [[0], [1], [2], [3], [4], [5]]),  # more ranks than cores: threads, spread over cores first
    (8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
])
def test_shares_never_overlap_and_take_whole_cores_while_they_go_round(size, shares):
    assert [share_of(rank, size, HT4) for rank in range(size)] == shares


def test_no_share_when_ranks_outnumber_hardware_threads_and_a_bad_rank_is_refused():
    assert share_of(0, 9, HT4) is None
    with pytest.raises(ValueError, match="local rank 2 is not in 0..1"):
        share_of(2, 2, HT4)


# A rank as the agent starts it: a helper thread exists before binding, as torch's pools may.
_RANK = """
import json, os, sys, threading
from ringtrain.env.binding import bind_rank
started = threading.Event()
threading.Thread(target=lambda: (started.set(), threading.Event().wait()), daemon=True).start()
started.wait()
state = bind_rank(sys.argv[1])
masks = {}
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/status") as fp:
        masks[tid] = next(l.split()[1] for l in fp if l.startswith("Cpus_allowed_list"))
print(json.dumps({"state": state, "again": bind_rank("none"), "masks": masks}))
"""


def _rank(setting: str, local_rank: int, local_size: int, cpus: set[int] | None = None) -> dict:
    launchers = ("RINGTRAIN_", "HOROVOD_", "OMPI_", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launchers)}
    env.update(TORCHELASTIC_RUN_ID="t", RANK=str(local_rank), WORLD_SIZE=str(local_size),
               LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_size), MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29500", GROUP_RANK="0")
    out = subprocess.run([sys.executable, "-c", _RANK, setting], env=env, capture_output=True, text=True,
                         check=True, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    return json.loads(out.stdout)


needs_two_cpus = pytest.mark.skipif(not owns_two_or_more_cpus(),
                                    reason="needs 2 or more CPUs, none of them taken away from this process")


@needs_two_cpus
def test_a_bound_rank_runs_every_thread_on_its_own_share():
    allowed = sorted(os.sched_getaffinity(0))
    shares = [share_of(rank, 2, physical_cores(allowed)) for rank in range(2)]
    for rank in range(2):
        result = _rank("core", rank, 2)
        assert shares[rank] is not None
        expected = format_cpu_list(shares[rank])
        assert result["state"] == f"cores {expected}"
        assert result["again"] == result["state"]  # the first answer holds for the process
        assert len(result["masks"]) >= 2
        assert set(result["masks"].values()) == {expected}, result
    assert not set(shares[0]) & set(shares[1])


@needs_two_cpus
def test_a_rank_bound_already_by_someone_else_is_left_alone():
    first = min(os.sched_getaffinity(0))
    result = _rank("core", 1, 2, cpus={first})
    assert result["state"].startswith(f"none (already bound to CPUs {first} of {os.cpu_count()}")
    assert set(result["masks"].values()) == {str(first)}


def test_more_ranks_than_hardware_threads_and_none_change_nothing():
    allowed = format_cpu_list(sorted(os.sched_getaffinity(0)))
    crowded = _rank("core", 0, 1024)
    assert crowded["state"] == f"none (1024 ranks on this host share {len(os.sched_getaffinity(0))} " \
                               "hardware threads)"
    unbound = _rank("none", 1, 2)
    assert unbound["state"] == "none"
    for result in (crowded, unbound):
        assert set(result["masks"].values()) == {allowed}


def test_an_unknown_place_on_the_host_is_said_not_guessed(monkeypatch):
    monkeypatch.setattr(binding, "_state", None)
    environ = {"TORCHELASTIC_RUN_ID": "t", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}
    state = binding.bind_rank("core", environ)
    assert state.startswith("none (this rank's place on its host is unknown"), state
    assert binding.binding_state() == state


def test_the_variable_is_checked_like_every_knob():
    from ringtrain.engine.settings import read_knob
    from ringtrain.exceptions import SettingError

    assert read_knob("bind", {}) == "none"
    assert read_knob("bind", {"RINGTRAIN_BIND": "core"}) == "core"
    with pytest.raises(SettingError, match="RINGTRAIN_BIND"):
        read_knob("bind", {"RINGTRAIN_BIND": "socket"})

