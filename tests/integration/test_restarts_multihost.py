"""``--max-restarts`` across two hosts in network namespaces (issue 10): a rank killed on hostB comes back.

Rank 0 runs on hostA, rank 1 on hostB. The launcher is started two ways: as a driver with
``-H hostA:1,hostB:1`` (it reaches hostB over ssh and hands the job's secret to the agent there on
its stdin), and by hand on each host (``--node-rank``, one shared ``RINGTRAIN_JOB_SECRET``). Either way
node 0's agent hosts the rendezvous on hostA, and killing rank 1 on hostB restarts the ranks on both
hosts, which resume from the newest checkpoint and finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.engine.auth import new_secret
from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, clean_env, ringtrain_argv, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = ROOT / "tests" / "launch" / "scripts" / "hvd_checkpoint.py"
STEPS = 200


@pytest.fixture
def hosts(netns_hosts: NamespaceHosts) -> NamespaceHosts:
    return netns_hosts


def _job(folder: Path) -> list[str]:
    return ["--max-restarts", "2", sys.executable, str(SCRIPT), str(folder), "--steps", str(STEPS),
            "--every", "20", "--step-seconds", "0.02"]


def _rank_on(hosts: NamespaceHosts, host: str, rank: int) -> int | None:
    """The training process of ``rank`` on ``host`` (the innermost one running the script)."""
    found = {}
    for pid in hosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if SCRIPT.name.encode() in cmdline and f"RANK={rank}".encode() in environ:
            found[pid] = ppid
    leaves = [pid for pid in found if pid not in found.values()]
    return leaves[0] if len(leaves) == 1 else None


def _kill_rank_1_after_a_checkpoint(hosts: NamespaceHosts, folder: Path, procs: list[subprocess.Popen],
                                    logs: list[Path]) -> str:
    """Kill rank 1 on hostB once a checkpoint exists; returns every command line on both hosts before."""
    wait_for(lambda: any(folder.glob("ckpt-*.pt")) or any(p.poll() is not None for p in procs), 400,
             "the first checkpoint", logs=logs)
    assert all(p.poll() is None for p in procs), [log.read_text() for log in logs]
    pid = _rank_on(hosts, "hostB", 1)
    assert pid is not None, [log.read_text() for log in logs]
    lines = []
    for host in ("hostA", "hostB"):
        for other in hosts.pids(host):
            try:
                lines.append(Path(f"/proc/{other}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    os.kill(pid, signal.SIGKILL)
    return "\n".join(lines)


def _finish(procs: list[subprocess.Popen]) -> list[int]:
    try:
        return [proc.wait(timeout=400) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_driver_restarts_both_hosts_when_a_remote_rank_dies(hosts: NamespaceHosts, tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    run = ringtrain_argv("run", "-np", "2", "-H", "hostA:1,hostB:1", "-i", str(hosts.key), "--start-timeout",
                         "120", *_job(tmp_path))
    argv = hosts.command("hostA", run)
    with open(log, "w") as out:
        launcher = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=ROOT)
    command_lines = _kill_rank_1_after_a_checkpoint(hosts, tmp_path, [launcher], [log])
    (code,) = _finish([launcher])
    output = log.read_text()
    assert code == 0, output
    assert "attempt 0 failed at" in output, output
    assert "rank 1 on hostB killed by SIGKILL" in output
    assert "another node restarted its ranks after attempt 0" in output  # hostA's agent followed
    assert "resumed at step" in output
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["step"], result["attempt"]) == (STEPS, "1")
    # the secret went to hostB on the agent's stdin, never on a command line (ssh's, or the agent's)
    assert "ssh" in command_lines
    assert "RINGTRAIN_JOB_SECRET" not in command_lines


def test_nodes_started_by_hand_on_two_hosts_restart_together(hosts: NamespaceHosts, tmp_path: Path) -> None:
    port = 29400 + os.getpid() % 500
    env = clean_env({"RINGTRAIN_JOB_SECRET": new_secret()})
    logs = [tmp_path / "hostA.log", tmp_path / "hostB.log"]
    procs = []
    for rank, (host, log) in enumerate(zip(("hostA", "hostB"), logs)):
        run = ringtrain_argv("run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                             "--master-addr", "hostA", "--master-port", str(port), *_job(tmp_path))
        argv = hosts.command(host, run)
        with open(log, "w") as out:
            procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
    _kill_rank_1_after_a_checkpoint(hosts, tmp_path, procs, logs)
    codes = _finish(procs)
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    assert "rank 1 on hostB killed by SIGKILL" in outputs[1], outputs[1]
    assert "another node restarted its ranks after attempt 0" in outputs[0], outputs[0]
    assert "unauthenticated" not in "".join(outputs)  # the exported secret was used on both
    assert json.loads((tmp_path / "result.json").read_text())["step"] == STEPS
