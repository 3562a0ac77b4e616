"""``ringtrain run --ray`` on this machine: bad input, and one job on a local Ray cluster (one per module).

The two-host runs (one rank per Ray node, a failing rank, a lost node) are in
tests/integration/test_ray_two_hosts.py.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.engine.netutil import free_port
from tests.integration.system import wait_for

SCRIPT = """
import os, sys
env = os.environ
print(f"rank={env['RANK']} local_rank={env['LOCAL_RANK']} local_size={env['LOCAL_WORLD_SIZE']} "
      f"ray_imported={'ray' in sys.modules} gloo={env.get('GLOO_SOCKET_IFNAME')}", flush=True)
"""


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "hello.py"
    path.write_text(SCRIPT)
    return str(path)


def test_without_ray_installed_one_line_names_the_pip_command(monkeypatch, capsys, script):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    code = main(["run", "--ray", "-np", "2", "python", script])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == ["ringtrain run: error: --ray needs Ray, which is not installed here. "
                                        "HINT: pip install 'ringtrain[ray]'"]


ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")


@pytest.mark.slow
def test_an_address_nobody_answers_on_fails_within_the_start_timeout(capsys, script):
    if ray.is_initialized():
        pytest.skip("this process is connected to a Ray cluster already")
    address = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    code = main(["run", "--ray", address, "--start-timeout", "2", "-np", "2", "python", script])
    err = capsys.readouterr().err
    assert code == 2  # nothing started: the user's to fix, as a bad flag
    assert f"no Ray cluster answers at {address} within 2 s" in err
    assert "raise --start-timeout" in err
    assert time.monotonic() - began < 30  # generous: the bound is the timeout plus one connection attempt


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[None]:
    """A Ray cluster of two CPUs started by this process; ``ringtrain run --ray`` joins it (connected)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def all_cpus_free() -> None:
    """Wait for the cluster's two CPUs to be free again (Ray frees a removed placement group a little
    later); fail after a generous 60 s."""
    wait_for(lambda: ray.available_resources().get("CPU") == 2, 60, "both CPUs free again")


@pytest.mark.slow
def test_a_placement_the_cluster_cannot_fit_names_asked_and_offered(local_cluster, capsys, script):
    code = main(["run", "--ray", "-np", "3", "--ray-placement-timeout", "1", "python", script])
    err = capsys.readouterr().err
    assert code == 1
    assert re.search(r"could not place 3 bundle\(s\) of \{CPU: 1\} \(PACK\) within 1 s: the cluster has "
                     r"\{CPU: 2\} in all", err), err
    assert "raise --ray-placement-timeout" in err
    all_cpus_free()  # nothing stays reserved


#: Fails rank 1 on the first attempt only (torch's agent counts the restarts for its ranks), once rank 0
#: has said its line: a rank 0 that starts later than rank 1 fails (a loaded machine) would be stopped
#: before it printed anything, and its line of the first attempt would be missing.
FAILS_ONCE = SCRIPT + """
import pathlib, time
said = pathlib.Path(__file__).with_name(f"said-{env['TORCHELASTIC_RESTART_COUNT']}-{env['RANK']}")
said.touch()
if env["RANK"] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "0":
    deadline = time.monotonic() + 120
    while not said.with_name("said-0-0").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    raise SystemExit("rank 1 fails on the first attempt")
"""


@pytest.mark.slow
def test_nproc_per_node_ranks_share_one_agent_which_restarts_them(local_cluster, capsys, tmp_path):
    """One job for two points: --nproc-per-node 2 puts both ranks in one bundle under one agent, and
    --max-restarts restarts them there as on any node."""
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    code = main(["run", "--ray", "-np", "2", "--nproc-per-node", "2", "--max-restarts", "1", "python",
                 str(script)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = re.findall(r"^\[\d\] rank=.*$", out, re.MULTILINE)
    # both on one node: the ranks talk over loopback, as a one-host job's (two attempts)
    assert sorted(lines) == ["[0] rank=0 local_rank=0 local_size=2 ray_imported=False gloo=lo"] * 2 + \
        ["[1] rank=1 local_rank=1 local_size=2 ray_imported=False gloo=lo"] * 2, out + err
    assert "attempt 0 failed" in err, err
    assert "rank 1 fails on the first attempt" in err, err
    assert "the job finished after 1 restart(s)" in err, err
    all_cpus_free()  # the placement group was removed, the actors are gone


@pytest.mark.slow
def test_elastic_min_np_larger_than_the_cluster_fails_after_the_elastic_timeout_naming_both(
        local_cluster, capsys, tmp_path):
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('no worker may start')\n")
    code = main(["run", "--ray", "-np", "3", "--min-np", "3", "--elastic-timeout", "1", "python",
                 str(script)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "only 2 slot(s) usable, fewer than the 3 needed (-np 3), for --elastic-timeout 1 s" in err
    assert "the Ray cluster's living nodes (1 CPU(s) a slot)" in err
    assert "no worker may start" not in err


@pytest.mark.slow
def test_each_node_keeps_the_one_actor_of_its_agent_and_the_group_keeps_every_bundle(local_cluster):
    """The actor of every other bundle ends once it said where it is (each is a Ray worker process that
    would cost the ranks CPU for the whole job); the placement group still holds that bundle's CPU."""
    from ringtrain.launch.config import LaunchConfig
    from ringtrain.launch.ray.driver import place

    placement = place(LaunchConfig(command=("python", "x.py"), num_proc=2, ray="auto"))
    try:
        assert [node.slots for node in placement.nodes] == [2]  # PACK: both bundles on this one node
        assert len(placement.actors) == 1
        assert placement.nodes[0].actors == placement.actors
        group = placement.reservation.group.id.hex()
        # Ray counts each bundle's resources apart: bundle 0's CPU is the agent actor's, bundle 1's is
        # free within the group once its actor ended, and the group holds both CPUs of the cluster
        wait_for(lambda: ray.available_resources().get(f"CPU_group_1_{group}") == 1, 60,
                 "the spare bundle's actor ended")
        available = ray.available_resources()
        assert available.get(f"CPU_group_0_{group}", 0) == 0, available
        assert available.get("CPU", 0) == 0, available
        assert ray.get(placement.actors[0].free_port.remote(), timeout=60) > 0  # the kept one answers
    finally:
        placement.release()
    all_cpus_free()


#: A stand-in node agent: says its secret line and a variable sent along, beats once, echoes the link's
#: lines until "stop".
AGENT = """
import os, sys
print(f"secret {sys.stdin.readline().strip()} extra {os.environ['EXTRA']}", flush=True)
print("@@RINGTRAIN_ALIVE@@", file=sys.stderr, flush=True)
for line in sys.stdin:
    if line.strip() == "stop":
        print("stopping", file=sys.stderr, flush=True)
        raise SystemExit(143)
    print(f"heard {line.strip()!r}", flush=True)
"""


@pytest.mark.slow
def test_a_node_agent_runs_behind_its_bridge_once_its_actor_ended(local_cluster, tmp_path):
    """The fixed-size job's place: the actor starts the agent behind a bridge and is ended (no Ray worker
    process costs the ranks CPU); the link (the secret, output, heartbeats both ways, stop) goes on over
    the bridge's connection."""
    import io

    from ringtrain.launch.ray.actor import agent_actor
    from ringtrain.launch.ray.bridged_group import BridgedRayGroup

    actor = agent_actor(1, 0).remote()
    node = ray.get(actor.where.remote(), timeout=60)
    out, err, token = io.StringIO(), io.StringIO(), "k" * 64
    group = BridgedRayGroup("here", ["python", "-c", AGENT], {"EXTRA": "1"}, actor=actor, node=node,
                            ranks=range(0, 1), index=0, listen_host="127.0.0.1", token=token,
                            token_ref=ray.put(token), secret_ref=ray.put("s3cret"), out=out, err=err)
    def actor_gone() -> bool:
        try:
            ray.get(actor.where.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return True
        return False

    # the actor is gone (ray.kill is asynchronous: a call made at once may still be served), its agent
    # runs on
    wait_for(actor_gone, 60, "the node actor's end")
    wait_for(lambda: group.hearing.heard is not None, 60, "the agent's heartbeat")
    group.beat()
    wait_for(lambda: "heard ''" in out.getvalue(), 60, "the driver's heartbeat at the agent")
    group.stop()
    assert group.wait(timeout=60) == 143
    assert out.getvalue() == "secret s3cret extra 1\nheard ''\n"
    assert err.getvalue() == "stopping\n"  # the heartbeat is the link's, not the console's
    assert group.lost is None
    assert group.pid > 0
    all_cpus_free()


def test_node_0_is_the_drivers_own_ray_node_where_it_holds_ranks():
    from ringtrain.launch.ray.driver import RayNode, driver_node_first

    nodes = [RayNode({"node_id": name}, [], 1, []) for name in ("b", "c", "a")]
    assert [n.node["node_id"] for n in driver_node_first(nodes, "a")] == ["a", "b", "c"]
    assert [n.node["node_id"] for n in driver_node_first(nodes, "elsewhere")] == ["b", "c", "a"]


@pytest.mark.slow
def test_a_bridge_that_cannot_prove_the_token_is_refused_and_the_group_fails_naming_the_address(
        local_cluster):
    """The bridge proves another token than the driver's (as an impostor would): the driver never admits
    it, and gives up after its timeout with the address the nodes must reach."""
    from ringtrain.launch.ray.actor import agent_actor
    from ringtrain.launch.ray.bridged_group import BridgedRayGroup

    actor = agent_actor(1, 0).remote()
    node = ray.get(actor.where.remote(), timeout=60)
    with pytest.raises(TimeoutError, match=r"did not connect back to this driver at 127\.0\.0\.1:\d+ within "
                                           r"3 s\. HINT: the Ray nodes must reach the driver's address"):
        BridgedRayGroup("here", ["python", "-c", AGENT], {"EXTRA": "1"}, actor=actor, node=node,
                        ranks=range(0, 1), index=0, listen_host="127.0.0.1", token="a" * 64,
                        token_ref=ray.put("b" * 64), connect_timeout=3)
    ray.kill(actor)
    all_cpus_free()


#: A rank that says when it is ready, and ends once a SIGUSR1 reaches it.
WAITS_FOR_SIGUSR1 = """
import os, pathlib, signal, sys, time
def on_usr1(signum, frame):
    print(f"rank {os.environ['RANK']} got SIGUSR1", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, on_usr1)
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(120)
raise SystemExit("no SIGUSR1 came")
"""


@pytest.mark.slow
def test_a_sigusr1_at_the_driver_reaches_the_ranks_on_the_ray_node(local_cluster, capsys, tmp_path):
    """A scheduler's warning signal goes on to the ranks over the bridge's link, as over ssh: the rank
    ends cleanly from its handler (a Trainer would write its snapshot there)."""
    import os
    import signal
    import threading

    script, ready = tmp_path / "usr1.py", tmp_path / "ready"
    script.write_text(WAITS_FOR_SIGUSR1)

    def signal_once_ready() -> None:
        wait_for(ready.exists, 120, "the rank's ready file")
        os.kill(os.getpid(), signal.SIGUSR1)  # the driver (this process, in main()) forwards it

    sender = threading.Thread(target=signal_once_ready, daemon=True)
    sender.start()
    code = main(["run", "--ray", "-np", "1", "python", str(script), str(ready)])
    sender.join(timeout=10)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "[0] rank 0 got SIGUSR1" in out, out + err
    all_cpus_free()
