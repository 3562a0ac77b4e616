"""The root-cause report and the marker lines agents send to a driver."""

import signal

from ringtrain.launch.report import RankFailure, earliest, format_report


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


def test_report_names_host_rank_signal_and_traceback():
    text = format_report(failure(2, 0.0, exitcode=-signal.SIGKILL, traceback="Traceback\nBoom\n"), 2, 4)
    assert "hostB" in text
    assert "rank       : 2 of 4" in text
    assert "SIGKILL" in text
    assert "Boom" in text
    assert "1 other rank(s) failed after it" in text


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
