"""The root-cause report and the marker lines agents send to a driver."""

import signal

import pytest

from ringtrain.launch.report import (
    RankFailure,
    asks_for_gpu,
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
