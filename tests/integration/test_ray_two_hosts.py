"""``RayExecutor`` on a real two-node Ray cluster: ``ray start --head`` on hostA, ``ray start --address``
on hostB (network namespaces, dashboard off, one CPU declared on each), the driver on hostA.

Horovod's three Ray examples run unmodified through the shim with one worker on each host
(``num_hosts=2``: a ``STRICT_SPREAD`` placement group), so every collective crosses the link and the
workers reach the driver's job store on hostA's address.
"""

from __future__ import annotations

import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, clean_env, spawn_daemon, stop_daemons, tail

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = ROOT / "tests" / "ray" / "horovod_ray_examples.py"
GCS_PORT = 6380


@pytest.fixture(scope="module")
def ray_cluster(netns_hosts: NamespaceHosts) -> Iterator[tuple[dict[str, str], list[Path]]]:
    """The head on hostA, a worker node on hostB; the driver's variables (the head's address, the
    cluster's token) and the nodes' logs.

    Each node keeps its files in a temp folder of its own (both hosts share this machine's /tmp)."""
    head = netns_hosts.hosts["hostA"].address
    # Ray's token authentication, with a token of this cluster's own for its nodes and its driver
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    folders = [Path(tempfile.mkdtemp(prefix="rtray", dir="/tmp")) for _ in range(2)]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    common = ["--num-cpus", "1", "--block", "--disable-usage-stats"]
    daemons = [
        spawn_daemon(netns_hosts.command("hostA", [
            ray_cli, "start", "--head", "--port", str(GCS_PORT), "--node-ip-address", head,
            "--include-dashboard=false", "--temp-dir", str(folders[0] / "t"), *common]),
            folders[0] / "ray.log", env=clean_env(auth)),
        spawn_daemon(netns_hosts.command("hostB", [
            ray_cli, "start", "--address", f"{head}:{GCS_PORT}", "--node-ip-address",
            netns_hosts.hosts["hostB"].address, "--temp-dir", str(folders[1] / "t"), *common]),
            folders[1] / "ray.log", env=clean_env(auth)),
    ]
    try:
        yield {"RAY_ADDRESS": f"{head}:{GCS_PORT}", **auth}, [folder / "ray.log" for folder in folders]
    finally:
        stop_daemons(daemons, grace=20)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_horovods_ray_examples_on_two_hosts(netns_hosts: NamespaceHosts,
                                            ray_cluster: tuple[dict[str, str], list[Path]]) -> None:
    driver_env, logs = ray_cluster
    # the placement group waits (placement_group_timeout_s) until hostB has joined the head
    result = netns_hosts.run("hostA", [sys.executable, "-m", "ringtrain.shim", str(EXAMPLES)], timeout=500,
                             env={**driver_env, "HOSTS": "2"}, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:] + "".join(f"\n--- {log}:\n{tail(log)}" for log in logs)
    assert "stateless run: ranks [0, 1]" in output
    assert "stateful execute: first loss" in output
    assert "DistributedOptimizer training: loss" in output
    hosts = dict(re.findall(r"hello from rank (\d) of 2 on (host[AB])", output))
    assert sorted(hosts.values()) == ["hostA", "hostB"], output[-4000:]
