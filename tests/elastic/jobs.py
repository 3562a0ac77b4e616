"""A background elastic job for the tests: ``ringtrain run --host-discovery-script ...`` running
:mod:`tests.elastic.mnist_elastic`, with its log, its output folder and the hosts its discovery lists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.integration.system import ROOT, clean_env, wait_for
from tests.processes import alive

SCRIPT = Path(__file__).resolve().with_name("mnist_elastic.py")
#: Images of each epoch: enough for several commits per worker in an epoch (every gate of the tests
#: comes at one), few enough that training is a small part of a test (480 took twice the wall time).
SAMPLES = 128
#: Generous: a loaded 2-core machine takes 10+ s to import torch in each new worker.
JOB_TIMEOUT = 540


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class ElasticJob:
    """One ``ringtrain run`` elastic launcher in the background, its log, its output folder, its hosts."""

    def __init__(self, tmp_path: Path, hosts: list[str], flags: list[str], script_args: list[str],
                 wrap: Callable[[list[str]], list[str]] = lambda argv: argv,
                 env: dict[str, str] | None = None) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.hosts_file = tmp_path / "hosts.txt"
        self.set_hosts(hosts)
        discovery = tmp_path / "discover.sh"
        discovery.write_text(f"#!/bin/sh\ncat {self.hosts_file}\n")
        discovery.chmod(0o755)
        self.log = tmp_path / "launcher.log"
        argv = [sys.executable, "-m", "ringtrain", "run", *flags, "--host-discovery-script", str(discovery),
                sys.executable, str(SCRIPT), "--out", str(self.out), "--samples", str(SAMPLES), *script_args]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(wrap(argv), stdout=log, stderr=subprocess.STDOUT, env=clean_env(env),
                                         start_new_session=True, cwd=ROOT)

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


def assert_no_worker_left(job: ElasticJob) -> None:
    pids = job.worker_pids()
    wait_for(lambda: not any(alive(p) for p in pids), 60, "every worker process to end")
