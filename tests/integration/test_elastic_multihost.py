"""Elastic ``ringtrain run`` across the two namespace hosts: the driver on hostA, a worker on each host.

hostB's worker runs behind sshd (started over ssh with the job's secret on stdin). Killing it once
gets it replaced over ssh; killing the replacement too blacklists hostB and training goes on, on
hostA alone, to the end with every sample seen once per epoch. The elastic driver supervises its
workers as the static driver does its hosts (launch/supervision.py): a host cut off is noticed within
the static driver's bound, and a second Ctrl-C kills the workers on both hosts at once.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.elastic.jobs import ElasticJob
from tests.integration.netns import NamespaceHosts
from tests.integration.system import wait_for
from tests.integration.test_failures import (
    LAUNCHER_BOUND,
    PEER_TIMEOUT,
    Job,
    assert_no_process_left,
    press_ctrl_c_twice,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def hosts(netns_hosts: NamespaceHosts) -> NamespaceHosts:
    return netns_hosts


def test_worker_on_a_remote_host_is_replaced_then_its_host_blacklisted(hosts, tmp_path):
    job = ElasticJob(tmp_path, ["hostA:1", "hostB:1"],
                     ["-np", "2", "--min-np", "1", "--max-np", "2", "-i", str(hosts.key),
                      "--start-timeout", "60"],
                     ["--stall-host", "hostB", "--stall-after", "3", "--stall-count", "2"],
                     wrap=lambda argv: hosts.command("hostA", argv))
    try:
        job.kill_stalled("w2")
        job.wait_for_line("generation 2: 2 worker(s) on hostA[0],hostB[0]; started w3")
        job.kill_stalled("w3")
        code = job.finish()
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
    output = job.text()
    assert code == 0, output
    assert "worker w2 (rank 1 on hostB) failed" in output
    assert "host hostB is blacklisted after repeated failures" in output
    assert "generation 3: 1 worker(s) on hostA[0]" in output
    job.assert_every_sample_once(epochs=2)
    # nothing of the job is left on hostB
    assert_nothing_left_on_host_b(hosts)


def assert_nothing_left_on_host_b(hosts: NamespaceHosts) -> None:
    wait_for(lambda: not [pid for pid in hosts.pids("hostB") if _is_ours(pid)], 60,
             "the job's processes on hostB to end")


def _is_ours(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return b"mnist_elastic.py" in fp.read() and pid != os.getpid()
    except OSError:
        return False


def _environ(pid: int) -> dict[bytes, bytes]:
    """The environment ``pid`` started with (what the kernel shows, not later changes)."""
    with open(f"/proc/{pid}/environ", "rb") as fp:
        return dict(item.split(b"=", 1) for item in fp.read().split(b"\0") if b"=" in item)


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            return fp.read()
    except OSError:
        return b""


def test_the_secret_reaches_a_remote_worker_on_stdin_never_on_a_command_line(hosts, tmp_path):
    job = ElasticJob(tmp_path, ["hostA:1", "hostB:1"],
                     ["-np", "2", "--min-np", "2", "-i", str(hosts.key), "--start-timeout", "60"],
                     ["--stall-host", "hostB", "--stall-after", "1", "--stall-count", "1"],
                     wrap=lambda argv: hosts.command("hostA", argv))
    try:
        remote = job.wait_for_file("stalled-w2.json")["pid"]
        local = job.wait_for_file("progress-w1.json")["pid"]
        secret = _environ(local)[b"RINGTRAIN_JOB_SECRET"]  # a local worker gets it in its environment
        assert len(secret) == 64
        assert b"RINGTRAIN_JOB_SECRET" not in _environ(remote)
        commands = [_cmdline(pid) for host in ("hostA", "hostB") for pid in hosts.pids(host)]
        assert not [command for command in commands if secret in command]
        # the ssh client on hostA names the remote command, which asks for the secret on stdin
        assert [command for command in commands if b"RINGTRAIN_SECRET_ON_STDIN=1" in command]
    finally:
        os.killpg(job.proc.pid, signal.SIGTERM)
        code = job.proc.wait(timeout=120)
    assert code == 128 + signal.SIGTERM
    assert_nothing_left_on_host_b(hosts)


def test_a_host_cut_off_is_noticed_within_the_static_drivers_bound_and_the_job_goes_on(hosts, tmp_path):
    # As tests/integration/test_failures.py cuts the link under a static job: the driver must give
    # hostB's worker up within the same bound (its heartbeats, or ssh's keep-alives sized to them).
    job = ElasticJob(tmp_path, ["hostA:1", "hostB:1"],
                     ["-np", "2", "--min-np", "1", "--max-np", "2", "-i", str(hosts.key),
                      "--start-timeout", "60"],
                     ["--stall-host", "hostB", "--stall-after", "3", "--stall-count", "1"],
                     wrap=lambda argv: hosts.command("hostA", argv),
                     env={"RINGTRAIN_PEER_TIMEOUT_SECONDS": f"{PEER_TIMEOUT:g}"})
    try:
        job.wait_for_file("stalled-w2.json")  # hostB's worker waits at its gate; hostA's in an allreduce
        hosts.set_link(False)
        cut = time.monotonic()
        try:
            job.wait_for_line("worker w2 (rank 1 on hostB) failed: lost contact with host hostB",
                              timeout=2 * LAUNCHER_BOUND)
            said = next(line for line in job.text().splitlines() if "lost contact with host hostB" in line)
            print(f"the elastic driver gave hostB up {time.monotonic() - cut:.1f} s after the cut: {said}")
        finally:
            hosts.set_link(True)
        code = job.finish()
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
    output = job.text()
    assert code == 0, output  # the survivor went on with a new worker (or alone)
    job.assert_every_sample_once(epochs=2)
    assert_nothing_left_on_host_b(hosts)


#: Workers that ignore every stop signal (as ones stuck in a C call do), each saying when it is ready.
STUBBORN = ("import os, signal, time\n"
            "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "print('stubborn worker', os.environ['HOROVOD_RANK'], 'ready', flush=True)\n"
            "while True:\n"
            "    time.sleep(1)\n")


def test_a_second_ctrl_c_kills_an_elastic_jobs_workers_on_every_host_at_once(hosts, tmp_path):
    # The static driver's test (test_failures.py), for an elastic job (--min-np).
    job = Job(hosts, tmp_path, "--min-np", "2", command=(sys.executable, "-c", STUBBORN))
    code = press_ctrl_c_twice(job)
    output = job.output()
    assert code == 128 + signal.SIGINT, output
    assert "SIGINT again: killing the ranks on every host now." in output
    assert_no_process_left(hosts, timeout=20)  # hostB's worker too, across ssh
