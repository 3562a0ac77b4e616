"""Two ``ringtrain run`` processes as the two nodes of a static rendezvous, started by hand (issue 12).

The issue's commands: the same line on each node, only ``--node-rank`` differs, no ``--rdzv-id``.
The nodes meet at once (the run id is the same everywhere); nodes started with different settings
are told so on both nodes, naming what differs, by the rendezvous itself rather than a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ranks import free_port

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello.py"

pytestmark = pytest.mark.slow


def _node(node_rank: int, nnodes: int, port: int, *extra: str, nproc: int = 1) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "ringtrain", "run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
            "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port), *extra,
            "python", str(HELLO)]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _both(procs: list[subprocess.Popen[str]], guard: float) -> list[tuple[int, str]]:
    """Exit code and output of each node; a node still running after ``guard`` seconds is killed."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=guard)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed by the test after {guard:g} s)"
        results.append((proc.returncode, out + err))
    return results


def test_the_issue_s_two_commands_meet_without_rdzv_id():
    port = free_port()
    results = _both([_node(0, 2, port), _node(1, 2, port)], guard=240)
    for code, output in results:
        assert code == 0, output
    assert "hello from rank 0 of 2" in results[0][1]
    assert "hello from rank 1 of 2" in results[1][1]
    assert all("sum of ranks 1 ok" in output for _, output in results)


# --start-timeout 60 puts the rendezvous timeout at 240 s: far beyond the guard, so an error that
# comes within the guard was a detection, not a timeout.
@pytest.mark.parametrize(("nodes", "flag", "shown"), [
    ([(2, 1), (3, 1)], "--nnodes", ("2 on node 0", "3 on node 1")),
    ([(2, 1), (2, 2)], "--nproc-per-node", ("1 on node 0", "2 on node 1")),
])
def test_nodes_started_with_different_settings_are_told_on_both(nodes, flag, shown):
    port = free_port()
    procs = [_node(rank, nnodes, port, "--start-timeout", "60", nproc=nproc)
             for rank, (nnodes, nproc) in enumerate(nodes)]
    for code, output in _both(procs, guard=90):
        assert code == 2, output
        assert "the nodes of this job disagree at rendezvous" in output, output
        (line,) = [line for line in output.splitlines() if line.strip().startswith(flag)]
        assert shown[0] in line, output
        assert shown[1] in line, output
        assert "HINT:" in output
        assert "Traceback" not in output, output


def test_a_rank_killed_on_one_node_restarts_the_group_on_both(tmp_path):
    """node 1's rank dies: node 1's agent restarts, and node 0's agent sees it waiting and restarts too."""
    from tests.integration.system import wait_for
    from tests.launch.restart_trials import HVD_SCRIPT, rank_pids

    port = free_port()
    logs = [tmp_path / f"node{rank}.log" for rank in (0, 1)]
    procs = []
    for rank, log in enumerate(logs):
        argv = [sys.executable, "-m", "ringtrain", "run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--max-restarts", "2", "python", str(HVD_SCRIPT), str(tmp_path), "--steps", "200", "--every",
                "20", "--step-seconds", "0.02"]
        with open(log, "w") as out:
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True))
    try:
        wait_for(lambda: any(tmp_path.glob("ckpt-*.pt")) or any(p.poll() is not None for p in procs), 300,
                 "the first checkpoint", logs=logs)
        victims = rank_pids(procs[1].pid)
        assert list(victims) == [1], [log.read_text() for log in logs]
        os.kill(victims[1], signal.SIGKILL)
        codes = [proc.wait(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    outputs = [log.read_text() for log in logs]
    assert codes == [0, 0], outputs
    assert "attempt 0 failed at" in outputs[1], outputs[1]
    assert "rank 1 on " in outputs[1]
    assert "another node restarted its ranks after attempt 0" in outputs[0], outputs[0]
    assert "resumed at step" in outputs[0]
    assert "(attempt 1)" in outputs[0]  # the same attempt number on both nodes
    assert json.loads((tmp_path / "result.json").read_text())["step"] == 200


#: Rank 0 leaves its pid and ends; rank 1 fails only once rank 0's agent has taken that exit (its pid is
#: reaped): a failure that came sooner would find node 0 still running and restart both nodes' ranks.
FAILS_AFTER_RANK_0_ENDED = """
if [ "$RANK" = 0 ]; then echo $$ > "$MARKS/rank0.tmp" && mv "$MARKS/rank0.tmp" "$MARKS/rank0.pid"; exit 0; fi
while [ ! -s "$MARKS/rank0.pid" ]; do sleep 0.05; done
while [ -e "/proc/$(cat "$MARKS/rank0.pid")" ]; do sleep 0.05; done
exit 3
"""


def test_a_restart_after_the_other_node_finished_ends_the_job_on_both(tmp_path):
    """node 0's rank is done, node 1's fails and restarts: no group restart is possible, nobody waits."""
    port = free_port()
    argv = [sys.executable, "-m", "ringtrain", "run", "--nnodes", "2", "--nproc-per-node", "1",
            "--master-addr", "127.0.0.1", "--master-port", str(port), "--start-timeout", "60",
            "--max-restarts", "1"]
    env = {**os.environ, "MARKS": str(tmp_path)}
    procs = [subprocess.Popen([*argv, "--node-rank", str(rank), "sh", "-c", FAILS_AFTER_RANK_0_ENDED],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    (code0, out0), (code1, out1) = _both(procs, guard=90)  # far below the 240 s rendezvous timeout
    assert code0 == 1, out0
    assert "this node's ranks finished, but the job failed elsewhere" in out0, out0
    assert code1 == 1, out1
    assert "attempt 0 failed at" in out1, out1
    assert "had finished its ranks when another node restarted its own" in out1, out1
