"""``ringtrain run --min-np/--max-np/--host-discovery-script``: real elastic jobs on this machine.

The two "hosts" ``localhost`` and ``127.0.0.1`` are both this machine (as in Horovod's own elastic
tests); the discovery script prints what a file in the test's folder lists, so a test adds or
removes hosts by rewriting that file. The job is :mod:`tests.elastic.mnist_elastic`, which has the
API calls of Horovod's elastic MNIST example; its gates let a test kill a worker or change the
hosts at a known point, waiting on files rather than sleeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.system import clean_env, wait_for

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().with_name("mnist_elastic.py")
SAMPLES = 480
#: Generous: a loaded 2-core machine takes 10+ s to import torch in each new worker.
JOB_TIMEOUT = 540


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class ElasticJob:
    """One ``ringtrain run`` elastic launcher in the background, its log, its output folder, its hosts."""

    def __init__(self, tmp_path: Path, hosts: list[str], flags: list[str], script_args: list[str]) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.hosts_file = tmp_path / "hosts.txt"
        self.set_hosts(hosts)
        discovery = tmp_path / "discover.sh"
        discovery.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        discovery.chmod(0o755)
        self.log = tmp_path / "launcher.log"
        argv = [sys.executable, "-m", "ringtrain", "run", *flags, "--host-discovery-script", str(discovery),
                sys.executable, str(SCRIPT), "--out", str(self.out), *script_args]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                                         start_new_session=True)

    def set_hosts(self, hosts: list[str]) -> None:
        write_atomically(self.hosts_file, "".join(f"{h}\n" for h in hosts))

    def text(self) -> str:
        return self.log.read_text()

    def wait_for_file(self, name: str, timeout: float = JOB_TIMEOUT) -> dict:
        path = self.out / name
        wait_for(lambda: path.exists() or self.proc.poll() is not None, timeout, f"{name} from the job",
                 logs=[self.log])
        assert path.exists(), f"the launcher ended (code {self.proc.returncode}) before {name}\n{self.text()}"
        return json.loads(path.read_text())

    def wait_for_line(self, needle: str, timeout: float = JOB_TIMEOUT) -> None:
        wait_for(lambda: needle in self.text() or self.proc.poll() is not None, timeout, repr(needle),
                 logs=[self.log])
        assert needle in self.text(), self.text()

    def kill_stalled(self, worker: str) -> None:
        """SIGKILL the worker waiting at the stall gate (it wrote stalled-<worker>.json)."""
        os.kill(self.wait_for_file(f"stalled-{worker}.json")["pid"], signal.SIGKILL)

    def finish(self, timeout: float = JOB_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def worker_pids(self) -> list[int]:
        return [json.loads(p.read_text())["pid"] for p in self.out.glob("progress-*.json")]

    def assert_every_sample_once(self, epochs: int) -> None:
        for epoch in range(epochs):
            seen = json.loads((self.out / f"epoch-{epoch}.json").read_text())["seen"]
            assert len(seen) == SAMPLES
            assert set(seen) == {1}, f"epoch {epoch}: samples seen {sorted(set(seen))} times, not once"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return fp.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_no_worker_left(job: ElasticJob) -> None:
    pids = job.worker_pids()
    wait_for(lambda: not any(alive(p) for p in pids), 60, "every worker process to end")


@pytest.fixture
def cleanup():
    jobs: list[ElasticJob] = []
    yield jobs.append
    for job in jobs:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()


def test_sigkilled_worker_is_replaced_and_no_sample_is_lost_or_repeated(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"], ["-np", "2", "--min-np", "1", "--max-np", "2"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "3", "--stall-count", "1"])
    cleanup(job)
    job.kill_stalled("w2")  # after its third commit, while rank 0 waits for it in an allreduce
    code = job.finish()
    output = job.text()
    assert code == 0, output
    assert "worker w2 (rank 1 on 127.0.0.1) failed: killed by SIGKILL" in output
    assert "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w3" in output
    job.assert_every_sample_once(epochs=2)
    result = json.loads((job.out / "result.json").read_text())
    assert result == {"epochs": 2, "size": 2, "lr": pytest.approx(0.02), "worker": "w1",
                      "generation": "1"}
    assert_no_worker_left(job)


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


def test_a_host_failing_twice_is_blacklisted_and_min_np_ends_the_job_after_the_timeout(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"],
                     ["-np", "2", "--min-np", "2", "--max-np", "2", "--elastic-timeout", "3"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "3", "--stall-count", "2"])
    cleanup(job)
    job.kill_stalled("w2")
    job.wait_for_line("generation 2:")
    job.kill_stalled("w3")  # the replacement on the same host fails too
    code = job.finish()
    output = job.text()
    assert code == 1, output
    assert "host 127.0.0.1 is blacklisted after repeated failures" in output
    stop = next(line for line in output.splitlines() if "the job stops:" in line)
    assert "only 1 slot(s) usable, fewer than the 2 needed (--min-np 2), for --elastic-timeout 3 s" in stop
    assert "blacklisted: 127.0.0.1 for good" in stop
    assert "HINT:" in stop
    assert "Root cause" in output
    assert "killed by SIGKILL" in output
    assert "generation 3" not in output
    assert_no_worker_left(job)


def test_blacklisted_host_comes_back_after_its_cooldown(tmp_path, cleanup):
    job = ElasticJob(tmp_path, ["localhost:1", "127.0.0.1:1"],
                     ["-np", "2", "--min-np", "1", "--max-np", "2", "--blacklist-cooldown-range", "1", "2"],
                     ["--stall-host", "127.0.0.1", "--stall-after", "3", "--stall-count", "2",
                      "--pause-at-size", "1"])
    cleanup(job)
    job.kill_stalled("w2")
    job.wait_for_line("generation 2:")
    job.kill_stalled("w3")
    job.wait_for_file("paused.json")  # training goes on alone on localhost
    job.wait_for_line("host 127.0.0.1 is back from the blacklist")
    job.wait_for_line("hosts added; the group re-forms at the next commit")
    (job.out / "resume").touch()
    code = job.finish()
    output = job.text()
    assert code == 0, output
    assert "generation 3: 1 worker(s) on localhost[0]" in output  # on without the blacklisted host
    assert "generation 4: 2 worker(s) on localhost[0],127.0.0.1[0]; started w4" in output
    job.assert_every_sample_once(epochs=2)
