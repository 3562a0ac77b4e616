"""``RayExecutor`` on a real two-node Ray cluster: ``ray start --head`` on hostA, ``ray start --address``
on hostB (network namespaces, dashboard off, one CPU declared on each), the driver on hostA.

Horovod's three Ray examples run unmodified through the shim with one worker on each host
(``num_hosts=2``: a ``STRICT_SPREAD`` placement group), so every collective crosses the link and the
workers reach the driver's job store on hostA's address.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import (
    ROOT,
    clean_env,
    ringtrain_argv,
    spawn_daemon,
    stop_daemons,
    tail,
    wait_for,
)

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = ROOT / "tests" / "ray" / "horovod_ray_examples.py"
GCS_PORT = 6380


class RayCluster(NamedTuple):
    """The driver's variables (the head's address, the cluster's token), the nodes' logs, and the
    ``ray start --block`` process of each node (hostA's, hostB's)."""

    env: dict[str, str]
    logs: list[Path]
    daemons: list[subprocess.Popen[bytes]]


@pytest.fixture(scope="module")
def ray_cluster(netns_hosts: NamespaceHosts) -> Iterator[RayCluster]:
    """The head on hostA, a worker node on hostB (see :class:`RayCluster`). The module's last test
    takes hostB's node away.

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
        yield RayCluster({"RAY_ADDRESS": f"{head}:{GCS_PORT}", **auth},
                         [folder / "ray.log" for folder in folders], daemons)
    finally:
        stop_daemons(daemons, grace=20)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_horovods_ray_examples_on_two_hosts(netns_hosts: NamespaceHosts,
                                            ray_cluster: RayCluster) -> None:
    driver_env, logs = ray_cluster.env, ray_cluster.logs
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


# --- ringtrain run --ray: any script, one node agent per Ray node -----------------------------------

#: Says where each rank runs, whether it imported Ray and its niceness; rank FAIL_RANK (if set) fails,
#: and with STEPS every rank prints a line a step until stopped.
RANK_SCRIPT = """
import os, socket, sys, time
rank = int(os.environ["RANK"])
print(f"rank={rank} local_rank={os.environ['LOCAL_RANK']} of {os.environ['WORLD_SIZE']} "
      f"host={socket.gethostname()} ray_imported={'ray' in sys.modules} "
      f"nice={os.getpriority(os.PRIO_PROCESS, 0)}", flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    raise RuntimeError(f"rank {rank} gives up on purpose")
for step in range(int(os.environ.get("STEPS", "0"))):
    print(f"rank={rank} step={step}", flush=True)
    time.sleep(0.5)
"""


def run_on_ray(hosts: NamespaceHosts, cluster: RayCluster, script: Path, env: dict[str, str] | None = None,
               timeout: float = 300) -> subprocess.CompletedProcess[str]:
    # the script's variables reach the ranks as with ssh: through -x
    exports = [arg for name in (env or {}) for arg in ("-x", name)]
    argv = ringtrain_argv("run", "--ray", cluster.env["RAY_ADDRESS"], "-np", "2", *exports, "python",
                          str(script))
    return hosts.run("hostA", argv, timeout=timeout, env={**cluster.env, **(env or {})}, cwd=script.parent)


def test_ringtrain_run_ray_puts_one_rank_on_each_ray_node(netns_hosts: NamespaceHosts,
                                                         ray_cluster: RayCluster, tmp_path: Path) -> None:
    script = tmp_path / "where.py"
    script.write_text(RANK_SCRIPT)
    result = run_on_ray(netns_hosts, ray_cluster, script)
    output = result.stdout + result.stderr
    logs = "".join(f"\n--- {log}:\n{tail(log)}" for log in ray_cluster.logs)
    assert result.returncode == 0, output[-4000:] + logs
    seen = re.findall(r"^\[(\d)\] rank=(\d) local_rank=(\d) of 2 host=(host[AB]) ray_imported=(\w+) "
                      r"nice=(-?\d+)$", result.stdout, re.MULTILINE)
    # each rank's line carries its own prefix; one CPU per node: one rank on each, local rank 0
    assert sorted((prefix, rank, local) for prefix, rank, local, *_ in seen) == [("0", "0", "0"),
                                                                                ("1", "1", "0")], output
    assert sorted(host for *_, host, _, _ in seen) == ["hostA", "hostB"], output
    assert {imported for *_, imported, _ in seen} == {"False"}, output
    # not Ray's worker niceness (15): the niceness the Ray nodes were started with, as this process's
    assert {int(nice) for *_, nice in seen} == {os.getpriority(os.PRIO_PROCESS, 0)}, output


def test_ringtrain_run_ray_reports_the_rank_that_failed(netns_hosts: NamespaceHosts, ray_cluster: RayCluster,
                                                       tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(RANK_SCRIPT)
    result = run_on_ray(netns_hosts, ray_cluster, script, env={"FAIL_RANK": "1", "STEPS": "600"})
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-4000:]
    report = output[output.index("Root cause"):]
    assert "rank       : 1 of 2" in report, output[-4000:]
    assert "rank 1 gives up on purpose" in report, output[-4000:]
    assert re.search(r"host       : host[AB]", report), output[-4000:]


def test_ringtrain_train_ray_trains_across_the_two_ray_nodes(netns_hosts: NamespaceHosts,
                                                            ray_cluster: RayCluster, tmp_path: Path) -> None:
    """The Trainer's own launcher on Ray: one CPU per node puts a rank on each, and the hostB rank gets the
    job in its command (no file of the driver's). The smallest run that proves it: 2 steps."""
    results = tmp_path / "results.json"
    argv = ringtrain_argv("train", "mnist", "--ray", ray_cluster.env["RAY_ADDRESS"], "-np", "2", "--threads",
                          "1", "--epochs", "1", "--subset", "256", "--max-steps-per-epoch", "2",
                          "--no-progress", "--results-json", str(results))
    result = netns_hosts.run("hostA", argv, timeout=300, env=ray_cluster.env, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:] + "".join(f"\n--- {log}:\n{tail(log)}"
                                                            for log in ray_cluster.logs)
    assert "[0] ringtrain train: 2 rank(s)" in result.stdout, output[-4000:]
    body = json.loads(results.read_text())  # rank 0 wrote it on its node (both hosts share this disk)
    assert body["world_size"] == 2
    assert [epoch["steps"] for epoch in body["epochs"]] == [2]


def ray_processes_under(pid: int) -> list[int]:
    """The Ray processes among the descendants of ``pid`` (what `ray stop --force` would kill on that
    node), leaving out ringtrain's agent and everything under it (its ranks), which are no Ray
    processes."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fp:
                parent = int(fp.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fp:
                commands[int(entry)] = fp.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if "ringtrain.launch" not in commands.get(child, ""):
                todo.append(child)
                found.append(child)
    return found


def test_ringtrain_run_ray_names_the_node_and_ranks_lost(netns_hosts: NamespaceHosts, ray_cluster: RayCluster,
                                                        tmp_path: Path) -> None:
    """Last of the module: hostB's Ray node goes (its Ray processes SIGKILLed, as `ray stop --force` there
    would; `ray stop` itself would find hostA's too, both hosts share this machine's processes)."""
    script = tmp_path / "steps.py"
    script.write_text(RANK_SCRIPT)
    argv = ringtrain_argv("run", "--ray", ray_cluster.env["RAY_ADDRESS"], "-np", "2", "-x", "STEPS=600",
                          "python", str(script))
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen(netns_hosts.command("hostA", argv), stdout=out, stderr=subprocess.STDOUT,
                               env=clean_env(ray_cluster.env), cwd=tmp_path)
    try:
        wait_for(lambda: "rank=1 step=2" in log.read_text(), 180, "both ranks stepping", logs=[log])
        hostb = ray_cluster.daemons[1]
        for pid in [hostb.pid, *ray_processes_under(hostb.pid)]:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = job.wait(timeout=120)
        took = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
    output = log.read_text()
    assert code == 1, output[-4000:]
    report = output[output.index("Root cause"):]
    assert "host       : hostB" in report, output[-4000:]
    assert re.search(r"lost Ray node \S+ \(host hostB.*with rank \d of the job", report), output[-4000:]
    print(f"the job ended {took:.1f} s after hostB's Ray node went:\n{report}")  # shown with pytest -rA
    assert took < 60, f"the job took {took:.0f} s to end after hostB's Ray node went\n{output[-4000:]}"
    # hostB's agent, cut from its actor, stopped its rank: no process of the job is left anywhere
    wait_for(lambda: not processes_running(str(script)), 60, "every process of the job ended", logs=[log])


def processes_running(needle: str) -> list[int]:
    """Pids of the processes whose command line holds ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fp:
                if needle.encode() in fp.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found
