"""``ringtrain bench -H`` across the two namespace hosts, and the delayed link the link sweep uses."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts, start_hosts
from tests.integration.system import ROOT, ringtrain_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DELAY_MS = 20.0


@pytest.fixture
def delayed_hosts(tmp_path: Path) -> Iterator[NamespaceHosts]:
    hosts = start_hosts(tmp_path, bandwidth="100mbit", delay_ms=DELAY_MS)
    yield hosts
    hosts.stop()


def test_the_delay_link_holds_every_frame(delayed_hosts: NamespaceHosts) -> None:
    # a TCP connect is one round trip: at least two one-way delays, however loaded the machine is
    probe = ("import socket, time\n"
             "best = float('inf')\n"
             "for _ in range(3):\n"
             "    start = time.perf_counter()\n"
             "    socket.create_connection(('hostB', 22), timeout=10).close()\n"
             "    best = min(best, time.perf_counter() - start)\n"
             "print(best)\n")
    result = delayed_hosts.run("hostA", [sys.executable, "-c", probe])
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) >= 2 * DELAY_MS / 1000
    delayed_hosts.stop()
    stats = delayed_hosts.forwarder_stats()
    assert stats is not None
    assert min(stats["frames"]) > 0  # both ways
    assert sum(stats["bytes"]) > 0


def test_bench_runs_ranks_on_both_hosts(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    argv = ringtrain_argv("bench", "mnist", "--np", "1,2", "--steps", "4", "--warmup-steps", "1",
                          "--repeats", "1", "--strategies", "barrier,horovod", "--threads", "1",
                          "-H", "hostA:1,hostB:1", "-i", str(netns_hosts.key), "--start-timeout", "120",
                          "--no-progress", "--validate", "--out", str(out))
    result = netns_hosts.run("hostA", argv, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads((out / "scaling.json").read_text())
    assert body["link"]["kind"] == "between hosts"
    assert body["link"]["hosts"] == ["hostA", "hostB"]
    horovod = next(r for r in body["runs"] if r["strategy"] == "horovod")
    assert horovod["status"] == "ok"
    assert horovod["hosts"] == ["hostA", "hostB"]
    assert next(r for r in body["runs"] if r["strategy"] == "single")["hosts"] == ["hostA"]
    # the barrier ranks ran where horovod's did: their lockstep is the model's compute slow-down
    barrier = next(r for r in body["runs"] if r["strategy"] == "barrier")
    assert barrier["status"] == "ok"
    assert barrier["hosts"] == ["hostA", "hostB"]
    # across the hosts, horovod's replicas ended bit-identical
    digests = {r["parameters_digest"] for r in horovod["reports"]}
    assert len(digests) == 1
    (entry,) = body["validation"]
    assert entry["strategy"] == "horovod"
    assert entry["np"] == 2
    assert entry["compute_factor_from"] == "barrier"
