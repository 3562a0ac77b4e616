"""``RayExecutor`` on a real two-node Ray cluster: ``ray start --head`` on hostA, ``ray start --address``
on hostB (network namespaces, dashboard off, one CPU declared on each), the driver on hostA.

Horovod's three Ray examples run unmodified through the shim with one worker on each host
(``num_hosts=2``: a ``STRICT_SPREAD`` placement group), so every collective crosses the link and the
workers reach the driver's job store on hostA's address.
"""

from __future__ import annotations

import contextlib
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
#: The head's Ray Client server (Ray's default port, the one KubeRay exposes).
CLIENT_PORT = 10001
RAY_CLI = str(Path(sys.executable).with_name("ray"))
RAY_NODE_FLAGS = ["--num-cpus", "1", "--block", "--disable-usage-stats"]


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
    daemons = [
        spawn_daemon(netns_hosts.command("hostA", [
            RAY_CLI, "start", "--head", "--port", str(GCS_PORT), "--node-ip-address", head,
            "--ray-client-server-port", str(CLIENT_PORT), "--include-dashboard=false", "--temp-dir",
            str(folders[0] / "t"), *RAY_NODE_FLAGS]),
            folders[0] / "ray.log", env=clean_env(auth)),
    ]
    cluster = RayCluster({"RAY_ADDRESS": f"{head}:{GCS_PORT}", **auth},
                         [folder / "ray.log" for folder in folders], daemons)
    daemons.append(start_node_b(netns_hosts, cluster))
    try:
        yield cluster
    finally:
        stop_daemons(daemons, grace=20)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def start_node_b(hosts: NamespaceHosts, cluster: RayCluster) -> subprocess.Popen[bytes]:
    """hostB's Ray node joining the head (its files in the folder of its log)."""
    folder = cluster.logs[1].parent
    auth = {k: v for k, v in cluster.env.items() if k != "RAY_ADDRESS"}
    return spawn_daemon(hosts.command("hostB", [
        RAY_CLI, "start", "--address", cluster.env["RAY_ADDRESS"], "--node-ip-address",
        hosts.hosts["hostB"].address, "--temp-dir", str(folder / "t"), *RAY_NODE_FLAGS]),
        cluster.logs[1], env=clean_env(auth))


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
    hosts = dict(re.findall(r"^rank (\d) of 2 ran on (host[AB])$", result.stdout, re.MULTILINE))
    assert sorted(hosts.values()) == ["hostA", "hostB"], output[-4000:]


# --- ringtrain run --ray: any script, one node agent per Ray node -----------------------------------

#: Says where each rank runs, whether it imported Ray and its niceness; rank FAIL_RANK (if set) fails,
#: and with STEPS every rank prints a line a step until stopped.
RANK_SCRIPT = """
import os, socket, sys, time
rank = int(os.environ["RANK"])
print(f"rank={rank} local_rank={os.environ['LOCAL_RANK']} of {os.environ['WORLD_SIZE']} "
      f"host={socket.gethostname()} ray_imported={'ray' in sys.modules} "
      f"nice={os.getpriority(os.PRIO_PROCESS, 0)} gloo={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
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
                      r"nice=(-?\d+) gloo=(\S+)$", result.stdout, re.MULTILINE)
    # each rank's line carries its own prefix; one CPU per node: one rank on each, local rank 0
    assert sorted((prefix, rank, local) for prefix, rank, local, *_ in seen) == [("0", "0", "0"),
                                                                                ("1", "1", "0")], output
    assert sorted(host for *_, host, _, _, _ in seen) == ["hostA", "hostB"], output
    assert {imported for *_, imported, _, _ in seen} == {"False"}, output
    # not Ray's worker niceness (15): the niceness the Ray nodes were started with, as this process's
    assert {int(nice) for *_, nice, _ in seen} == {os.getpriority(os.PRIO_PROCESS, 0)}, output
    # ranks on two nodes: gloo finds the interface that reaches the other node, not loopback
    assert {gloo for *_, gloo in seen} == {"None"}, output


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
    job in its command (no file of the driver's). It trains to exactly the losses and accuracy of
    `ringtrain train -np 2` on hostA alone (the same seed and shards; a sum of two ranks' gradients is
    the same in any order): one epoch of 1,024 items, 8 steps."""
    results = tmp_path / "results.json"
    job = ["--threads", "1", "--epochs", "1", "--subset", "1024", "--no-progress", "--no-resume"]
    argv = ringtrain_argv("train", "mnist", "--ray", ray_cluster.env["RAY_ADDRESS"], "-np", "2", *job,
                          "--results-json", str(results))
    result = netns_hosts.run("hostA", argv, timeout=300, env=ray_cluster.env, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:] + "".join(f"\n--- {log}:\n{tail(log)}"
                                                            for log in ray_cluster.logs)
    assert "[0] ringtrain train: 2 rank(s)" in result.stdout, output[-4000:]
    body = json.loads(results.read_text())  # rank 0 wrote it on its node (both hosts share this disk)
    assert body["world_size"] == 2
    assert [epoch["steps"] for epoch in body["epochs"]] == [8]
    plain = tmp_path / "plain.json"
    alone = netns_hosts.run("hostA", ringtrain_argv("train", "mnist", "-np", "2", *job, "--results-json",
                                                    str(plain)), timeout=300, cwd=tmp_path)
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-4000:]
    facts = ("steps", "train_loss", "eval_loss", "accuracy", "eval_items")
    on_ray, on_one_host = body["epochs"][-1], json.loads(plain.read_text())["epochs"][-1]
    assert {k: on_ray[k] for k in facts} == {k: on_one_host[k] for k in facts}


def test_ringtrain_run_ray_through_a_ray_client_address(netns_hosts: NamespaceHosts, ray_cluster: RayCluster,
                                                        tmp_path: Path) -> None:
    """``--ray ray://HEAD:10001``: the driver is a Ray Client of the head, and the job still puts one rank
    on each node. Without ``RAY_AUTH_MODE=token`` Ray's client sends no token, the cluster's server opens
    no session, and the error says what to set (Ray itself reports only a timeout)."""
    script = tmp_path / "where.py"
    script.write_text(RANK_SCRIPT)
    argv = ringtrain_argv("run", "--ray", f"ray://{netns_hosts.hosts['hostA'].address}:{CLIENT_PORT}", "-np",
                          "2", "python", str(script))
    auth = {k: v for k, v in ray_cluster.env.items() if k != "RAY_ADDRESS"}
    result = netns_hosts.run("hostA", argv, env=auth, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:] + "".join(f"\n--- {log}:\n{tail(log)}"
                                                            for log in ray_cluster.logs)
    seen = re.findall(r"^\[(\d)\] rank=(\d) local_rank=0 of 2 host=(host[AB]) ray_imported=False ",
                      result.stdout, re.MULTILINE)
    assert [(prefix, rank) for prefix, rank, _ in sorted(seen)] == [("0", "0"), ("1", "1")], output[-4000:]
    assert sorted(host for *_, host in seen) == ["hostA", "hostB"], output[-4000:]
    # nothing of Ray's on the terminal: its client re-logs the server's warnings (one of them in about
    # two runs of three: "SIGTERM handler is not set because current thread is not the main thread.")
    assert [line for line in result.stderr.splitlines() if line.strip()
            and not line.startswith("ringtrain run:")] == [], result.stderr

    # the token without the mode: the client's retries shortened to a second each
    refused = netns_hosts.run("hostA", argv, cwd=tmp_path, env={
        "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": auth["RAY_AUTH_TOKEN"],
        "RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S": "1"})
    assert refused.returncode == 2, refused.stdout + refused.stderr  # nothing started
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr  # one line, no traceback, not Ray's own warning
    assert lines[0].startswith("ringtrain run: error: the Ray Client server at ray://"), refused.stderr
    assert "started no session" in lines[0], refused.stderr
    assert "RAY_AUTH_MODE=token" in lines[0], refused.stderr


def kill_ray_node(daemon: subprocess.Popen[bytes]) -> None:
    """SIGKILL a node's ``ray start --block`` and the Ray processes under it (see ray_processes_under)."""
    for pid in [daemon.pid, *ray_processes_under(daemon.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    daemon.wait()


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


#: A RayExecutor job of one worker per host, allreducing until stopped; prints what ``run`` raised.
EXECUTOR_DRIVER = """
import socket, sys, time
import ray
from ringtrain.ray import RayExecutor

def loop():
    import torch
    import ringtrain as hvd
    hvd.init()
    for step in range(1_000_000):
        hvd.allreduce(torch.ones(1000))
        if step % 10 == 0:
            print(f"rank={hvd.rank()} host={socket.gethostname()} step={step}", flush=True)
        time.sleep(0.05)

ray.init()
# half a CPU per worker: the `ringtrain run --ray` job of the same test takes the other halves
executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_hosts=2, num_workers_per_host=1,
                       cpus_per_worker=0.5)
executor.start()
try:
    executor.run(loop)
except Exception as exc:
    print(f"RUN FAILED {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
"""


def test_a_lost_ray_node_is_named_by_ringtrain_run_ray_and_by_ray_executor(
        netns_hosts: NamespaceHosts, ray_cluster: RayCluster, tmp_path: Path) -> None:
    """Last of the module: hostB's Ray node goes (its Ray processes SIGKILLed, as `ray stop --force` there
    would; `ray stop` itself would find hostA's too, both hosts share this machine's processes) while two
    jobs run across both nodes, half a CPU per rank each: a `ringtrain run --ray` job and a RayExecutor
    job allreducing in a loop. Both must end within 60 s, naming hostB and the rank they lost there."""
    script = tmp_path / "steps.py"
    script.write_text(RANK_SCRIPT)
    driver = tmp_path / "executor_loop.py"
    driver.write_text(EXECUTOR_DRIVER)
    argv = ringtrain_argv("run", "--ray", ray_cluster.env["RAY_ADDRESS"], "-np", "2", "--nproc-per-node", "1",
                          "--ray-cpus-per-rank", "0.5", "-x", "STEPS=600", "python", str(script))
    log, driver_log = tmp_path / "job.log", tmp_path / "driver.log"
    with open(log, "wb") as out, open(driver_log, "wb") as driver_out:
        job = subprocess.Popen(netns_hosts.command("hostA", argv), stdout=out, stderr=subprocess.STDOUT,
                               env=clean_env(ray_cluster.env), cwd=tmp_path)
        executor = subprocess.Popen(netns_hosts.command("hostA", [sys.executable, str(driver)]),
                                    stdout=driver_out, stderr=subprocess.STDOUT,
                                    env=clean_env(ray_cluster.env), cwd=ROOT)
    try:
        wait_for(lambda: "rank=1 step=2" in log.read_text(), 180, "both ranks stepping", logs=[log])
        wait_for(lambda: all(f"rank={r} host=host" in driver_log.read_text() for r in (0, 1)), 240,
                 "both RayExecutor ranks allreducing", logs=[driver_log, *ray_cluster.logs])
        kill_ray_node(ray_cluster.daemons[1])
        killed = time.monotonic()
        code = job.wait(timeout=120)
        took = time.monotonic() - killed
        executor_code = executor.wait(timeout=max(1.0, 120 - took))
        executor_took = time.monotonic() - killed
    finally:
        for proc in (job, executor):
            if proc.poll() is None:
                proc.kill()
    output = log.read_text()
    assert code == 1, output[-4000:]
    report = output[output.index("Root cause"):]
    assert "host       : hostB" in report, output[-4000:]
    assert re.search(r"lost Ray node \S+ \(host hostB.*with rank \d of the job", report), output[-4000:]
    print(f"the job ended {took:.1f} s after hostB's Ray node went:\n{report}")  # shown with pytest -rA
    assert took < 60, f"the job took {took:.0f} s to end after hostB's Ray node went\n{output[-4000:]}"
    # RayExecutor.run raised WorkerLostError naming hostB's rank and node
    driver_output = driver_log.read_text()
    assert executor_code == 3, driver_output[-4000:]
    failure = driver_output[driver_output.index("RUN FAILED"):].splitlines()[0]
    print(f"RayExecutor.run raised {executor_took:.1f} s after hostB's Ray node went: {failure}")
    rank_b = re.search(r"rank=(\d) host=hostB", driver_output).group(1)
    named = rf"WorkerLostError: rank {rank_b} on Ray node \S+ \(host hostB, node id"
    assert re.search(named, failure), failure
    assert executor_took < 60, f"run() raised only {executor_took:.0f} s after hostB's node went"
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


# --- ringtrain run --ray --min-np: an elastic job on the cluster's nodes ------------------------------

ELASTIC_SCRIPT = ROOT / "tests" / "elastic" / "mnist_elastic.py"
#: Small: 4 steps of 8 samples an epoch on each of the two workers.
ELASTIC_SAMPLES = 64
#: Lists the living nodes at hostB's address until there is none (a node SIGKILLed stays "alive" to
#: Ray for a few seconds): a node started there meanwhile would share the address with the dead one.
NODE_GONE = """
import ray, sys, time
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
while [n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[2]]:
    time.sleep(0.5)
"""


def test_ringtrain_run_ray_elastic_goes_on_without_a_lost_node(netns_hosts: NamespaceHosts,
                                                              ray_cluster: RayCluster,
                                                              tmp_path: Path) -> None:
    """Last of the module (it ends with hostB's node gone): an elastic job starts one worker on each
    Ray node; hostB's node is killed while its worker waits at a known commit; the job goes on with
    hostA's worker alone (--min-np 1) and ends with every sample of each epoch seen once. Both workers
    ran at the Ray nodes' niceness, not at Ray's worker niceness."""
    address_b = netns_hosts.hosts["hostB"].address
    if ray_cluster.daemons[1].poll() is not None:  # the fixed-size node-loss test took hostB's node
        gone = netns_hosts.run("hostA", [sys.executable, "-c", NODE_GONE, ray_cluster.env["RAY_ADDRESS"],
                                         address_b], timeout=120, env=ray_cluster.env)
        assert gone.returncode == 0, gone.stderr[-2000:]
        ray_cluster.daemons[1] = start_node_b(netns_hosts, ray_cluster)
    out = tmp_path / "out"
    out.mkdir()
    argv = ringtrain_argv("run", "--ray", ray_cluster.env["RAY_ADDRESS"], "-np", "2", "--min-np", "1",
                          "--max-np", "2", "--elastic-timeout", "120", "python", str(ELASTIC_SCRIPT), "--out",
                          str(out), "--samples", str(ELASTIC_SAMPLES), "--stall-host", address_b,
                          "--stall-after", "2", "--stall-count", "1")
    log = tmp_path / "job.log"
    with open(log, "wb") as sink:
        job = subprocess.Popen(netns_hosts.command("hostA", argv), stdout=sink, stderr=subprocess.STDOUT,
                               env=clean_env(ray_cluster.env), cwd=tmp_path)
    try:
        # the job waits (--elastic-timeout) for hostB's node to join before its first generation
        wait_for(lambda: list(out.glob("stalled-*.json")) or job.poll() is not None, 300,
                 "hostB's worker at its gate", logs=[log, *ray_cluster.logs])
        assert list(out.glob("stalled-*.json")), log.read_text()[-4000:]
        kill_ray_node(ray_cluster.daemons[1])
        code = job.wait(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    output = log.read_text()
    assert code == 0, output[-4000:]
    address_a = netns_hosts.hosts["hostA"].address
    first = re.search(r"generation 1: 2 worker\(s\) on (\S+)\[0\],(\S+)\[0\]", output)
    assert first, output[-4000:]
    assert sorted(first.groups()) == sorted([address_a, address_b]), output[-4000:]
    assert re.search(rf"worker w\d \(rank \d on {re.escape(address_b)}\) failed: .*lost Ray node", output), \
        output[-4000:]
    assert f"generation 2: 1 worker(s) on {address_a}[0]" in output, output[-4000:]
    for epoch in range(2):
        seen = json.loads((out / f"epoch-{epoch}.json").read_text())["seen"]
        assert seen == [1] * ELASTIC_SAMPLES, f"epoch {epoch}: {seen}"
    assert json.loads((out / "result.json").read_text())["size"] == 1
    # each worker's actor had the fixed-size driver's options (agent_actor in launch/ray/actor.py): not
    # Ray's worker niceness (15) but the Ray nodes', as this process's
    progress = {p.name: json.loads(p.read_text()) for p in out.glob("progress-*.json")}
    assert {body["host"] for body in progress.values()} == {address_a, address_b}, progress
    assert {body["nice"] for body in progress.values()} == {os.getpriority(os.PRIO_PROCESS, 0)}, progress
    wait_for(lambda: not processes_running(str(ELASTIC_SCRIPT)), 60, "every process of the job ended",
             logs=[log])
