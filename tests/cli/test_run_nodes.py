"""Two ``ringtrain run`` processes as the two nodes of a static rendezvous, started by hand as a user would.

The issue's commands: the same line on each node, only ``--node-rank`` differs, and no ``--rdzv-id``.
Each node must find the other at node 0's address at once (the run id is the same everywhere), and a
node started with a different ``--nnodes`` must be told so on both nodes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ranks import free_port

ROOT = Path(__file__).resolve().parents[2]
HELLO = ROOT / "examples" / "hello.py"

pytestmark = pytest.mark.slow


def _node(node_rank: int, nnodes: int, port: int, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "ringtrain", "run", "--nnodes", str(nnodes), "--nproc-per-node", "1",
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


def test_static_rendezvous_needs_no_rdzv_id():
    port = free_port()
    results = _both([_node(0, 2, port), _node(1, 2, port)], guard=240)
    for code, output in results:
        assert code == 0, output
    assert "hello from rank 0 of 2" in results[0][1]
    assert "hello from rank 1 of 2" in results[1][1]
    assert all("sum of ranks 1 ok" in output for _, output in results)


def test_mismatched_nnodes_is_reported_on_both_nodes():
    # --start-timeout 60 puts the rendezvous timeout at minutes: the guard is far below it, so an error
    # within the guard was a detection, not a timeout.
    port = free_port()
    results = _both([_node(0, 2, port, "--start-timeout", "60"), _node(1, 3, port, "--start-timeout", "60")],
                    guard=60)
    for code, output in results:
        assert code != 0, output
        assert "--nnodes" in output, output
        assert "2" in output, output
        assert "3" in output, output
        assert "Traceback" not in output, output
