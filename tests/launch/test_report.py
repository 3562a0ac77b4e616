"""The root-cause report and the marker lines agents send to a driver."""

import signal
import socket
import sys
from pathlib import Path

import pytest

from ringtrain.engine.background import SHUT_DOWN_MESSAGE
from ringtrain.launch.report import (
    SHUT_DOWN_WORDS,
    RankFailure,
    asks_for_gpu,
    because_of_another_rank,
    earliest,
    format_earlier_attempts,
    format_report,
    no_gpu_hint,
    preempted,
)


def failure(rank, time, exitcode=1, **kw):
    return RankFailure(host="hostB", rank=rank, local_rank=0, exitcode=exitcode, pid=10 + rank, time=time,
                       **kw)


def test_marker_round_trip():
    f = failure(3, 12.5, message="ValueError: x", traceback="Traceback ...\nValueError: x\n")
    assert RankFailure.from_marker(f.to_marker()) == f
    assert RankFailure.from_marker("ordinary output") is None


def test_earliest_prefers_real_failures_over_ranks_stopped_by_their_agent():
    stopped = failure(0, 1.0, exitcode=-signal.SIGTERM)
    real = failure(1, 2.0)
    later = failure(2, 3.0)
    assert earliest([later, stopped, real]) is real


def test_within_a_second_a_rank_that_said_why_comes_before_one_timed_to_the_second():
    # torch's agent times a rank without an error file to the whole second (100.0 for 100.9)
    said = failure(0, 100.4, exitcode=2, message="cannot write snapshot (ENOSPC)")
    silent = failure(1, 100.0, exitcode=2)
    assert earliest([silent, said]) is said
    assert earliest([failure(1, 99.0, exitcode=2), said]).rank == 1  # an earlier second still wins


@pytest.mark.parametrize("message", [
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:40123",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer",
    "RuntimeError: [gloo/transport/tcp/pair.cc:575] Write error [127.0.0.1]:5555: Broken pipe",
    "ControlPlaneError: rank 0 closed its control connection (it exited or failed)",
    "ControlPlaneError: connection to rank 0 failed during a transfer: [Errno 104] reset",
])
def test_within_a_second_a_rank_that_lost_its_peer_comes_after_the_rank_that_was_killed(message):
    # rank 0 SIGKILLed at 100.7 (timed 100.0, no error file); rank 1 saw the closed connection at 100.8
    killed = failure(0, 100.0, exitcode=-signal.SIGKILL)
    consequence = failure(1, 100.8, message=message)
    assert earliest([consequence, killed]) is killed
    assert earliest([killed, consequence]) is killed
    # a rank that said something else still comes first within its second, and an earlier second wins
    assert earliest([killed, failure(2, 100.9, message="ValueError: bad batch")]).rank == 2
    assert earliest([failure(1, 99.9, message=message), killed]).rank == 1
    # and it is still a root cause when nothing else failed
    assert earliest([consequence]) is consequence


# What ringtrain's engine raises on a rank whose collectives fail because another rank failed first
# (engine.background, engine.liveness, engine.control_plane); the shut-down text is the engine's own.
SHUT_DOWN = f"HorovodInternalError: {SHUT_DOWN_MESSAGE}"
SILENT = ("rank 1 on host hostB has given no sign of life for 31 s (RINGTRAIN_PEER_TIMEOUT_SECONDS=30): its "
          "process was killed or hung, its host went down, or the network between hostA and it was cut")
TOLD = ("rank 1 on host hostB has failed: rank 2 on host hostC heard no heartbeat from it for 30 s "
        "(RINGTRAIN_PEER_TIMEOUT_SECONDS); its process was killed or hung, its host went down, or the "
        "network to it was cut")
CONSEQUENCES = [
    # another rank stopped the engine (its interpreter exited after its own error)
    pytest.param(SHUT_DOWN, id="shut-down"),
    pytest.param(f"{SHUT_DOWN} (rank 0 on host hostA: {SILENT})", id="shut-down-peer-silent"),
    pytest.param(f"{SHUT_DOWN} (rank 0 on host hostA: {TOLD})", id="shut-down-peer-declared-failed"),
    pytest.param(f"{SHUT_DOWN} (rank 0 on host hostA: a collective failed: RuntimeError: [gloo] Timed out "
                 "waiting 1800000ms (rank 1 on host hostB exited: its connection is closed))",
                 id="shut-down-collective-peer-exited"),
    pytest.param(f"ControlPlaneError: {TOLD}", id="control-plane-peer-declared-failed"),
    pytest.param("ControlPlaneError: a gloo operation was abandoned: rank 1 on host hostB left",
                 id="wait-abandoned"),
]


@pytest.mark.parametrize("message", CONSEQUENCES)
def test_a_rank_whose_engine_shut_down_because_another_failed_comes_after_the_rank_that_failed(message):
    killed = failure(1, 100.0, exitcode=-signal.SIGKILL)  # no error file: timed to the second
    consequence = failure(0, 100.6, message=message)
    assert earliest([consequence, killed]) is killed
    assert earliest([killed, consequence]) is killed
    assert earliest([consequence]) is consequence  # still a root cause when nothing else failed


@pytest.mark.parametrize("message", [
    f"{SHUT_DOWN} (stall: requests waited longer than HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=60)",
    f"{SHUT_DOWN} (rank 0 on host hostA: a collective failed: RuntimeError: input tensor has a bad size)",
    "HorovodInternalError: Mismatched allreduce tensor shapes: One rank sent a tensor of shape [2], but "
    "another rank sent a tensor of shape [3].",
    "HorovodInternalError: Reducescatter currently only supports AVERAGE and SUM.",
])
def test_an_engine_error_that_is_the_rank_s_own_finding_stays_a_cause(message):
    killed = failure(1, 100.0, exitcode=-signal.SIGKILL)
    cause = failure(0, 100.6, message=message)
    assert earliest([killed, cause]) is cause


@pytest.mark.parametrize("consequence", [
    SHUT_DOWN,
    f"{SHUT_DOWN} (rank 0 on host hostA: {SILENT})",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[127.0.0.1]:40123",
])
@pytest.mark.parametrize(("failed_at", "consequence_at"), [
    (100.30, 100.35),  # the same second
    (100.95, 101.02),  # the next one
    (100.30, 100.10),  # even timed first (another host's clock): the consequence is second within it
])
def test_a_rank_stopped_by_sigterm_after_its_own_error_is_the_root_cause(consequence, failed_at,
                                                                          consequence_at):
    # rank 1 raised and wrote its error file, but was still exiting when rank 0, whose engine shut down
    # under it, exited: torch's agent then stopped rank 1 with SIGTERM
    failed = failure(1, failed_at, exitcode=-signal.SIGTERM, message="RuntimeError: boom at step 5",
                     traceback='Traceback ...\n    raise RuntimeError("boom at step 5")\n')
    other = failure(0, consequence_at, message=consequence)
    assert earliest([other, failed]) is failed
    assert earliest([failed, other]) is failed
    # ranks stopped by SIGTERM without an error of their own still come last, after every other failure
    silent = failure(2, 1.0, exitcode=-signal.SIGTERM)
    assert earliest([silent, other, failed]) is failed
    assert earliest([silent, other]) is other
    stopped_after_consequence = failure(3, 1.0, exitcode=-signal.SIGTERM, message=consequence)
    assert earliest([stopped_after_consequence, other, failed]) is failed
    assert earliest([stopped_after_consequence, failure(0, 101.0, exitcode=2)]).rank == 0


def test_a_node_that_lost_node_0_comes_after_the_rank_node_0_lost():
    # rank 0 on hostA was killed (its agent times it to the whole second, with no message); node 1's
    # agent then lost the rendezvous node 0 hosted, and said so, inside the same second
    killed = failure(0, 100.0, exitcode=-signal.SIGKILL)
    lost = RankFailure(host="hostB", rank=-1, local_rank=-1, exitcode=1, pid=7, time=100.4,
                       message="node 1: lost node 0, which hosts the rendezvous at hostA:31426 (node 0 "
                               "(hostA) gave up: its rank(s) 0 failed in attempt 0): its agent ended or "
                               "its host is unreachable. HINT: look at node 0's output for the cause.")
    assert earliest([lost, killed]) is killed
    assert earliest([killed, lost]) is killed


@pytest.mark.parametrize("other_message", ["ValueError: bad batch", ""])
def test_a_sigterm_d_rank_with_its_own_error_is_ordered_by_its_time_like_any_failure(other_message):
    stopped_after_error = failure(1, 100.4, exitcode=-signal.SIGTERM, message="RuntimeError: boom")
    later = failure(0, 101.0, exitcode=2, message=other_message)
    assert earliest([later, stopped_after_error]) is stopped_after_error
    # and an earlier real failure still wins over it
    earlier = failure(2, 99.5, exitcode=2, message="ValueError: first")
    assert earliest([stopped_after_error, earlier]) is earlier


def test_the_report_of_a_root_stopped_by_sigterm_after_its_error_says_so_and_lists_the_consequence():
    root = failure(1, 100.3, exitcode=-signal.SIGTERM, message="RuntimeError: boom at step 5",
                   traceback='Traceback ...\n    raise RuntimeError("boom at step 5")\n')
    consequence = failure(0, 100.35, message=SHUT_DOWN)
    assert earliest([consequence, root]) is root
    text = format_report(root, 2, 2, others=[consequence, root])
    lines = text.splitlines()
    assert "  rank       : 1 of 2" in lines
    assert "  status     : killed by SIGTERM (while exiting after the error below)" in lines
    assert "  error      : RuntimeError: boom at step 5" in lines
    assert '        raise RuntimeError("boom at step 5")' in lines
    assert [line for line in lines if line.startswith("  also       : ")] == [
        f"  also       : rank 0 on hostB exit code 1 ({SHUT_DOWN})"]
    assert lines[-1] == "  (1 other rank(s) failed after it; every other rank was stopped.)"
    # a root stopped by SIGTERM without an error (nothing else failed) keeps the plain status
    assert "  status     : killed by SIGTERM\n" in format_report(failure(1, 1.0, exitcode=-signal.SIGTERM))


def test_the_consequence_words_follow_the_engine_s_shut_down_message():
    assert SHUT_DOWN_MESSAGE.startswith(SHUT_DOWN_WORDS)
    assert because_of_another_rank(f"HorovodInternalError: {SHUT_DOWN_MESSAGE}")


def test_report_names_host_rank_signal_and_traceback():
    text = format_report(failure(2, 0.0, exitcode=-signal.SIGKILL, traceback="Traceback\nBoom\n"), 2, 4)
    assert "hostB" in text
    assert "rank       : 2 of 4" in text
    assert "SIGKILL" in text
    assert "Boom" in text
    assert "1 other rank(s) failed after it" in text


@pytest.mark.parametrize(("fields", "expected"), [
    ({"message": "AssertionError: Torch not compiled with CUDA enabled"}, True),
    ({"message": "RuntimeError: Distributed package doesn't have NCCL built in"}, True),
    ({"message": "RuntimeError: No CUDA GPUs are available"}, True),
    ({"message": "RuntimeError: Found no NVIDIA driver on your system."}, True),
    ({"output_tail": "some output\nRuntimeError: ProcessGroupNCCL is only supported with GPUs\n"}, True),
    ({"message": "ValueError: rank one gives up"}, False),
    ({"output_tail": "cuda was mentioned\nbut the error is elsewhere\n"}, False),
])
def test_asks_for_gpu(fields, expected):
    assert asks_for_gpu(failure(1, 0.0, **fields)) is expected


def test_the_report_shows_the_hint():
    text = format_report(failure(1, 0.0, message="AssertionError: Torch not compiled with CUDA enabled",
                                 hint=no_gpu_hint("hostB")))
    assert "no CUDA device is visible here (host hostB" in text
    assert "HINT:" in text


def test_a_report_after_restarts_lists_every_attempt_and_survives_the_marker_hop():
    root = failure(1, 5.0, exitcode=-signal.SIGKILL,
                   history=("attempt 0 ended 10:00:00: rank 1 on hostB killed by SIGKILL; every rank "
                            "restarted",
                            "attempt 1 ended 10:00:09: rank 0 on hostB exit code 1; no restart left"))
    assert RankFailure.from_marker(root.to_marker()) == root
    text = format_report(root, 1, 2)
    assert text.startswith("ringtrain run: job failed after 1 restart(s). Root cause (first rank to fail):")
    assert "attempts   :" in text
    assert "    attempt 0 ended 10:00:00: rank 1 on hostB killed by SIGKILL" in text
    assert "no restart left" in text


def test_earlier_attempts_keep_each_failure_s_traceback_short():
    long_trace = "\n".join(["Traceback (most recent call last):"]
                           + [f'  File "train.py", line {n}, in f{n}' for n in range(40)]
                           + ["RuntimeError: boom"])
    attempts = [
        (0, 0.0, [failure(1, 2.0, message="RuntimeError: boom", traceback=long_trace), failure(0, 3.0)]),
        (1, 60.0, []),  # another node's failure restarted this one
        (2, 90.0, [failure(0, 4.0, exitcode=-signal.SIGKILL, output_tail="epoch 3/5\n")]),
    ]
    text = format_earlier_attempts(attempts, keep=6)
    lines = text.splitlines()
    assert lines[0] == "ringtrain run: the job finished after 3 restart(s); earlier attempts:"
    assert lines[1].endswith(": rank 1 on hostB exit code 1 (RuntimeError: boom) "
                             "(1 other rank(s) ended after it)")
    assert lines[2:8] == ["    Traceback (most recent call last):", "      ... (37 line(s) left out)",
                          '      File "train.py", line 37, in f37', '      File "train.py", line 38, in f38',
                          '      File "train.py", line 39, in f39', "    RuntimeError: boom"]
    assert lines[8].endswith(": another node restarted its ranks")
    assert lines[9].endswith(": rank 0 on hostB killed by SIGKILL")
    assert lines[10] == "    epoch 3/5"
    assert len(lines) == 11


def test_other_ranks_that_said_why_they_stopped_get_a_line_each_and_repeats_none():
    root = failure(0, 1.0, exitcode=2, message="cannot write snapshot: No space left on device (ENOSPC)")
    told = failure(1, 2.0, exitcode=2, message="rank 0 failed writing a snapshot: ... (ENOSPC)")
    same = failure(2, 2.5, exitcode=2, message=root.message)  # says nothing the root did not
    stopped = failure(3, 3.0, exitcode=-signal.SIGTERM)  # stopped by its agent: nothing to say
    text = format_report(root, 4, 4, others=[root, told, same, stopped])
    also = [line for line in text.splitlines() if line.startswith("  also       : ")]
    assert also == ["  also       : rank 1 on hostB exit code 2 "
                    "(rank 0 failed writing a snapshot: ... (ENOSPC))"]
    assert text.count("No space left on device") == 1


def test_ranks_that_all_stopped_with_75_or_were_stopped_after_are_preempted_not_failed():
    assert preempted([failure(0, 1.0, exitcode=75), failure(1, 1.2, exitcode=75)])
    assert preempted([failure(0, 1.0, exitcode=75), failure(1, 2.0, exitcode=-signal.SIGTERM)])
    assert not preempted([failure(0, 1.0, exitcode=75), failure(1, 0.5, exitcode=1)])  # a real failure
    assert not preempted([failure(0, 1.0, exitcode=75), failure(1, 2.0, exitcode=-signal.SIGKILL)])
    assert not preempted([failure(0, 1.0, exitcode=-signal.SIGTERM)])
    assert not preempted([])


RAISE_SCRIPT = Path(__file__).parent / "scripts" / "hvd_raise.py"
#: Trials of the race below; each is one 2-rank job of a tiny script (about 3 s on 2 cores).
RAISE_TRIALS = 10


@pytest.mark.slow
def test_the_rank_that_raised_is_the_root_cause_though_it_was_stopped_while_exiting(capfd):
    # the job that `ringtrain run -np 2 python hvd_raise.py` starts on one host (driver._launch_node ->
    # run_node): rank 1 raises, rank 0's engine shuts down under it, rank 0 exits first and its agent
    # stops rank 1 with SIGTERM while rank 1 is still exiting (see the script), in every trial
    from ringtrain.launch.agent import NodeSpec, run_node
    from tests.ranks import free_port

    for n in range(RAISE_TRIALS):
        node = NodeSpec(nproc=2, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_timeout=60.0,
                        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
        code = run_node(node, [sys.executable, str(RAISE_SCRIPT)])
        err = capfd.readouterr().err
        where = f"trial {n + 1} of {RAISE_TRIALS}:\n{err[-6000:]}"
        assert code == 1, where
        report = err[err.index("Root cause (first rank to fail):"):].splitlines()
        assert "  rank       : 1" in report, where
        assert "  status     : killed by SIGTERM (while exiting after the error below)" in report, where
        assert "  error      : RuntimeError: boom at step 5" in report, where
        assert '        raise RuntimeError("boom at step 5")' in report, where
        assert [line for line in report if line.startswith("  also       : rank 0 ")] == [
            f"  also       : rank 0 on {socket.gethostname()} exit code 1 ({SHUT_DOWN})"], where
        # each rank marks in its own output where it failed; only rank 1's traceback is in the report
        assert "[1] RuntimeError: boom at step 5 (traceback in the launcher's failure report)" in err, where
        assert (f"[0] {SHUT_DOWN} (because another rank failed or stopped first; see the launcher's "
                "report)") in err, where


def test_a_rank_its_agent_stopped_is_not_counted_as_failed_after_the_root():
    root = failure(0, 1.0, exitcode=2, message="SnapshotError: No space left on device (ENOSPC)")
    stopped = failure(1, 2.0, exitcode=-signal.SIGTERM)  # no error of its own
    text = format_report(root, 2, others=[root, stopped])
    assert "(every other rank was stopped.)" in text
    assert "other rank(s) failed after it" not in text
    failed = failure(1, 2.0, exitcode=1, message="RankFailedError: rank 0 failed")
    assert "(1 other rank(s) failed after it;" in format_report(root, 2, others=[root, failed])
