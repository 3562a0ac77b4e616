"""Stuck jobs under ``ringtrain run``: the report names the rank waited for, and --hang-timeout ends them.

Each job's rank 1 gets stuck at step 5 (tests/watch/scripts/stuck.py); the hang timeout is a few seconds
so that each job ends quickly. The bounds a user sees with the defaults are decided in test_diagnosis.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

STUCK = str(Path(__file__).resolve().parent / "scripts" / "stuck.py")
STUCK_LINE = next(n for n, line in enumerate(Path(STUCK).read_text().splitlines(), 1)
                  if "# the stuck line" in line)

pytestmark = pytest.mark.slow


def run_stuck(mode: str, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "ringtrain", "run", *flags, "-np", "2", sys.executable, STUCK, mode]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def stacks_file(err: str) -> Path:
    return Path(err.split("every rank's stacks: ")[1].splitlines()[0])


def test_a_ddp_rank_blocked_in_python_is_named_with_its_line_and_the_job_ends(tmp_path):
    result = run_stuck("block", "--hang-timeout", "3")
    err = result.stderr
    assert result.returncode == 1, err
    assert "the job waits for rank 1:" in err
    assert "is blocked (no CPU use), at " + STUCK + f":{STUCK_LINE} in get_stuck" in err
    assert "rank 0 waits in all_reduce #" in err
    assert "Root cause (first rank to fail):" in err
    root = err.split("Root cause")[1]
    assert "rank       : 1" in root
    assert "stuck, ended by the watch" in root
    assert "threading.Event().wait()  # the stuck line" in root  # rank 1's own stack
    stacks = stacks_file(err).read_text()
    assert "=== rank 0 on" in stacks
    assert "=== rank 1 on" in stacks
    assert "backward" in stacks  # rank 0 waits for its gradients' allreduce


def test_ranks_that_call_different_collectives_are_a_mismatch_with_both_sides():
    result = run_stuck("mismatch", "--hang-timeout", "3")
    err = result.stderr
    assert result.returncode == 1, err
    assert "rank 0 is in all_reduce #" in err
    assert "rank 1 is in broadcast #" in err
    assert "different collectives" in err


def test_a_stopped_rank_is_named_as_stopped():
    result = run_stuck("stop", "--hang-timeout", "3")
    err = result.stderr
    assert result.returncode == 1, err
    assert "rank 1 on" in err
    assert "is stopped (SIGSTOP" in err
    assert "(no stack: it is stopped)" in stacks_file(err).read_text()


def test_a_horovod_rank_blocked_is_the_root_cause_not_the_rank_waiting_for_it():
    result = run_stuck("hvd", "--hang-timeout", "3")
    err = result.stderr
    assert result.returncode == 1, err
    assert "the job waits for rank 1:" in err
    assert "rank 0 waits in the Horovod engine for allreduce" in err
    root = err.split("Root cause")[1]
    assert "rank       : 1" in root
    assert "threading.Event().wait()  # the stuck line" in root


def test_horovod_s_stall_shutdown_time_ends_a_watched_job_naming_the_rank_waited_for():
    result = run_stuck("hvd", "--stall-check-warning-time-seconds", "1",
                       "--stall-check-shutdown-time-seconds", "3")
    err = result.stderr
    assert result.returncode == 1, err
    root = err.split("Root cause")[1]
    assert "rank       : 1" in root
    assert "ended by the hang timeout, 3 s" in root
    assert err.count("One or more tensors were submitted") <= 1


@pytest.mark.parametrize("api", ["ddp", "hvd"])
def test_a_rank_slower_than_the_others_is_named_live_and_in_the_run_s_summary(api):
    script = str(Path(STUCK).with_name("slow_rank.py"))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", sys.executable, script, "150", api]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    live = [line for line in result.stderr.splitlines() if "is the slowest" in line]
    assert live, result.stderr
    assert live[0].startswith("ringtrain run: rank 1 on ")
    assert live[-1].startswith("ringtrain run: over the whole run, rank 1 on ")
    assert " ms after the others (median)" in live[-1]
