"""``ringtrain run --min-np/--max-np/--host-discovery-script``: real elastic jobs on this machine.

The two "hosts" ``localhost`` and ``127.0.0.1`` are both this machine (as in Horovod's own elastic
tests); the discovery script prints what a file in the test's folder lists, so a test adds or
removes hosts by rewriting that file. The job is :mod:`tests.elastic.mnist_elastic`, which has the
API calls of Horovod's elastic MNIST example; its gates let a test kill a worker or change the
hosts at a known point, waiting on files rather than sleeping.

The driver's decisions alone (a host blacklisted after two failures, then --min-np slots missing for
--elastic-timeout; every message of it) are checked without processes in
tests/launch/test_elastic_driver.py; here one job per behaviour, with real workers.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.elastic.jobs import ElasticJob, assert_no_worker_left

pytestmark = pytest.mark.slow


@pytest.fixture
def cleanup():
    jobs: list[ElasticJob] = []
    yield jobs.append
    for job in jobs:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()


def test_a_host_added_by_discovery_joins_at_the_next_commit(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1"], ["-np", "1", "--min-np", "1", "--max-np", "2"],
                     ["--pause-at-size", "1"])
    cleanup(job)
    paused = job.wait_for_file("paused.json")
    assert paused["size"] == 1
    job.set_hosts(["localhost:1", "127.0.0.1:1"])
    job.wait_for_line("hosts added; the group re-forms at the next commit")  # rank 0 has the news
    (job.out / "resume").touch()
    code = job.finish()
    output = job.text()
    assert code == 0, output
    assert "hosts changed (new slots 127.0.0.1[0])" in output
    assert "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w2" in output
    assert "failed:" not in output
    assert "generation 1 ends: its 1 worker(s) re-form the group for the changed hosts (reset 1)" in output
    job.assert_every_sample_once(epochs=2)
    result = json.loads((job.out / "result.json").read_text())
    assert (result["size"], result["lr"]) == (2, pytest.approx(0.02))  # the reset callback rescaled it
    assert json.loads((job.out / "progress-w2.json").read_text())["size"] == 2


def test_sigkilled_worker_is_replaced_its_host_blacklisted_then_back_and_no_sample_lost_or_repeated(
        tmp_path, cleanup):
    # A worker SIGKILLed is replaced (w2 by w3); its host failing again (w3) is blacklisted, training goes
    # on alone, and the host comes back after its cooldown (w4). One job for what were two tests (the
    # replacement, and the cooldown that began with the same replacement).
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"],
                     ["-np", "2", "--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "1", "2"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "3", "--stall-count", "2",
                      "--pause-at-size", "1"])
    cleanup(job)
    job.kill_stalled("w2")  # after its third commit, while rank 0 waits for it in an allreduce
    job.wait_for_line("generation 2:")
    job.kill_stalled("w3")
    job.wait_for_file("paused.json")  # training goes on alone on localhost
    job.wait_for_line("host 127.0.0.1 is back from the blacklist")
    job.wait_for_line("hosts added; the group re-forms at the next commit")
    (job.out / "resume").touch()
    code = job.finish()
    output = job.text()
    assert code == 0, output
    assert "worker w2 (rank 1 on 127.0.0.1) failed: killed by SIGKILL" in output
    assert "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w3" in output
    assert "generation 3: 1 worker(s) on localhost[0]" in output  # on without the blacklisted host
    assert "generation 4: 2 worker(s) on localhost[0],127.0.0.1[0]; started w4" in output
    job.assert_every_sample_once(epochs=2)
    result = json.loads((job.out / "result.json").read_text())
    assert result == {"epochs": 2, "size": 2, "lr": pytest.approx(0.02), "worker": "w1",
                      "generation": "1"}
    assert_no_worker_left(job)


def test_reset_limit_ends_the_job_at_the_next_break(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"],
                     ["-np", "2", "--min-np", "1", "--reset-limit", "0"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "2"])
    cleanup(job)
    job.kill_stalled("w2")
    code = job.finish()
    output = job.text()
    assert code == 1, output
    assert "the job stops: the group broke again after --reset-limit 0 re-formation(s)" in output
    assert "rank       : 1" in output  # the root cause: the killed worker
    assert "generation 2" not in output
    assert_no_worker_left(job)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stopping_the_driver_leaves_no_worker(tmp_path, cleanup, sig):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"], ["-np", "2", "--min-np", "1"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "1"])
    cleanup(job)
    job.wait_for_file("stalled-w2.json")
    job.wait_for_file("progress-w1.json")
    pids = job.worker_pids()
    assert len(pids) == 2
    os.kill(job.proc.pid, sig)  # the driver alone: its workers must notice (stdin, parent-death signal)
    code = job.finish()
    assert code == (128 + sig if sig == signal.SIGTERM else -sig)
    assert_no_worker_left(job)


def test_a_host_dropped_by_discovery_leaves_at_the_next_commit(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"], ["-np", "2", "--min-np", "1", "--max-np", "2"],
                     ["--pause-at-size", "2"])
    cleanup(job)
    job.wait_for_file("paused.json")
    job.set_hosts(["localhost:1"])
    job.wait_for_line("hosts removed; the group re-forms at the next commit")
    (job.out / "resume").touch()
    code = job.finish()
    output = job.text()
    assert code == 0, output
    assert "hosts changed (slots gone 127.0.0.1[0])" in output
    assert "generation 2: 1 worker(s) on localhost[0]" in output
    assert "worker w2 has no place in generation 2" in output  # it exits 0, no traceback
    assert "Traceback" not in output
    assert "failed:" not in output
    job.assert_every_sample_once(epochs=2)
    assert json.loads((job.out / "result.json").read_text())["size"] == 1
