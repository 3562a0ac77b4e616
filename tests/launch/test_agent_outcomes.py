"""How one node's run ends: the outcome table of ``run_node`` (launch/agent.py), decided without starting
an agent (torch's failure records and exceptions made by hand)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ringtrain.exceptions import RendezvousFailedError, RendezvousMismatchError
from ringtrain.launch import agent
from ringtrain.launch.agent import NodeSpec, _NodeRun, _outcomes
from ringtrain.launch.report import PREEMPTED_EXIT, RankFailure


def node_run(tmp_path, **fields) -> _NodeRun:
    return _NodeRun(NodeSpec(nproc=2, rdzv_endpoint="10.0.0.1:29500", **fields), "hostA", str(tmp_path))


def exit_code(run: _NodeRun, exc: BaseException) -> int:
    for kind, outcome in _outcomes():
        if isinstance(exc, kind):
            return outcome(run, exc)
    raise AssertionError(f"no outcome for {exc!r}")


def child_failed(*exitcodes: int) -> ChildFailedError:
    failures = {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="")
                for rank, code in enumerate(exitcodes)}
    return ChildFailedError("ringtrain", failures)


def test_the_table_ends_with_what_catches_everything_else() -> None:
    kinds = [kind for kind, _ in _outcomes()]
    assert kinds[-1] is Exception
    assert KeyboardInterrupt in kinds
    # each specific kind comes before any kind it derives from
    for i, kind in enumerate(kinds):
        assert not any(issubclass(kind, earlier) for earlier in kinds[:i]), kind


def test_ranks_that_failed_print_the_report_and_exit_1(tmp_path, capsys) -> None:
    assert exit_code(node_run(tmp_path), child_failed(3, 1)) == 1
    err = capsys.readouterr().err
    assert err.startswith("ringtrain run: job failed. Root cause (first rank to fail):\n"
                          "  host       : hostA\n")
    assert "(1 other rank(s) failed after it; every other rank was stopped.)" in err


def test_ranks_that_ended_on_ctrl_c_are_no_failure_to_report(tmp_path, capsys) -> None:
    assert exit_code(node_run(tmp_path), child_failed(-signal.SIGINT, 128 + signal.SIGINT)) == 130
    assert capsys.readouterr().err == ""


def test_ranks_that_all_stopped_after_their_snapshot_are_preempted(tmp_path, capsys) -> None:
    assert exit_code(node_run(tmp_path), child_failed(PREEMPTED_EXIT, PREEMPTED_EXIT)) == PREEMPTED_EXIT
    assert "ringtrain run:" in capsys.readouterr().err


def test_a_signal_to_the_agent_is_128_plus_its_number_unless_the_ranks_stopped_gracefully(
        tmp_path, capsys) -> None:
    run = node_run(tmp_path)
    assert exit_code(run, SignalException("stop", signal.SIGTERM)) == 128 + signal.SIGTERM
    run.agents.append(SimpleNamespace(rank_exit_codes=lambda: [PREEMPTED_EXIT, PREEMPTED_EXIT]))
    assert exit_code(run, SignalException("stop", signal.SIGTERM)) == PREEMPTED_EXIT
    assert "2 rank(s)" in capsys.readouterr().err
    driven = node_run(tmp_path, failure_marker=True)  # a driver's agent leaves the words to the driver
    driven.agents.append(SimpleNamespace(rank_exit_codes=lambda: [PREEMPTED_EXIT]))
    assert exit_code(driven, SignalException("stop", signal.SIGUSR1)) == PREEMPTED_EXIT
    assert capsys.readouterr().err == ""


def test_keyboard_interrupt_is_130(tmp_path) -> None:
    assert exit_code(node_run(tmp_path), KeyboardInterrupt()) == 130


@pytest.mark.parametrize("marker", [False, True])
def test_settings_that_disagree_are_the_users_to_fix(tmp_path, capsys, marker: bool) -> None:
    exc = RendezvousMismatchError("node 1 says -np 4, node 0 says -np 2")
    assert exit_code(node_run(tmp_path, failure_marker=marker), exc) == 2
    err = capsys.readouterr().err
    if marker:
        found = RankFailure.from_marker(err.strip())
        assert (found.rank, found.exitcode, found.message) == (-1, 2, str(exc))
    else:
        assert err == f"ringtrain run: error: {exc}\n"


def test_a_meeting_that_failed_names_the_node(tmp_path, capsys) -> None:
    exc = RendezvousFailedError("node 0 never came")
    assert exit_code(node_run(tmp_path, node_rank=3), exc) == 1
    assert capsys.readouterr().err == "ringtrain run: error: node 3: node 0 never came\n"


def test_anything_else_says_where_the_nodes_were_to_meet(tmp_path, capsys) -> None:
    assert exit_code(node_run(tmp_path), OSError("connection refused")) == 1
    err = capsys.readouterr().err
    assert "rendezvous static at 10.0.0.1:29500): OSError: connection refused" in err
    assert "HINT: check that node 0 is reachable at 10.0.0.1:29500" in err


def test_finished_ranks_of_a_job_that_failed_elsewhere_exit_1(tmp_path, capsys) -> None:
    run = node_run(tmp_path)
    assert agent._finished(run) == 0
    run.agents.append(SimpleNamespace(closed_while_finishing="node 1 lost"))
    assert agent._finished(run) == 1
    assert "this node's ranks finished, but the job failed elsewhere: node 1 lost" in capsys.readouterr().err


def test_a_node_that_lost_node_0_still_reports_its_rank_that_had_failed_on_its_own(tmp_path, capsys) -> None:
    """Rank 1 here raised (its error file written) and was still exiting when node 0 gave up after its
    own rank failed because of rank 1: the driver hears of rank 1's error as well as of the lost node,
    and rank 1, timed first, is the root cause (CI once named rank 0 on the other host)."""
    import json

    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {
        "message": "RuntimeError: boom at step 5",
        "extraInfo": {"py_callstack": 'Traceback ...\n    raise RuntimeError("boom at step 5")\n',
                      "timestamp": "100"}}}))
    run = node_run(tmp_path, failure_marker=True)
    run.agents.append(SimpleNamespace(rank_errors=lambda: [(1, 0, 4242, str(error_file))]))
    lost = RendezvousFailedError("lost node 0, which hosts the rendezvous at 10.0.0.1:29500 (closed): its "
                                 "agent ended or its host is unreachable. HINT: look at node 0's output.")
    assert exit_code(run, lost) == 1
    markers = [RankFailure.from_marker(line) for line in capsys.readouterr().err.splitlines()]
    own, node = [m for m in markers if m is not None]
    assert (own.rank, own.message, own.time, own.pid) == (1, "RuntimeError: boom at step 5", 100.0, 4242)
    assert node.rank == -1
    assert "lost node 0" in node.message
    consequence = RankFailure(host="hostA", rank=0, local_rank=0, exitcode=1, pid=7, time=100.2,
                              message="HorovodInternalError: Horovod has been shut down.")
    assert agent.earliest([consequence, node, own]) is own
