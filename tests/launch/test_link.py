"""The driver<->child link (launch/link.py): the driver's end on a pipe, the child's end in a real child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.launch import link
from tests.processes import alive, wait_until


def test_the_silence_limit_is_the_peer_timeout_or_with_restarts_the_rendezvous_node_timeout():
    from ringtrain.launch.rendezvous import NODE_TIMEOUT

    assert link.contact_timeout(8.0) == 8.0
    assert link.contact_timeout(8.0, max_restarts=0) == 8.0
    assert link.contact_timeout(2.0, max_restarts=3) == max(2.0, NODE_TIMEOUT)
    assert link.beat_interval(20.0) == link.BEAT_INTERVAL
    assert link.beat_interval(2.0) == 0.5  # four beats fit in the limit


def test_a_place_where_beats_cost_round_trips_beats_a_quarter_of_the_limit_both_ways():
    # the Ray drivers' pulse, and what their agents and workers read from the variable they are given
    assert link.sparse_beat_interval(20.0) == 5.0
    given = {link.ENV_BEAT_INTERVAL: f"{link.sparse_beat_interval(20.0):g}"}
    assert link.beat_interval(20.0, given) == 5.0
    assert link.beat_interval(8.0, given) == 2.0  # never fewer than four beats in the silence limit
    # a value that is no positive number is not the driver's: the default interval
    for bad in ("", "soon", "0", "-3"):
        assert link.beat_interval(20.0, {link.ENV_BEAT_INTERVAL: bad}) == link.BEAT_INTERVAL
    assert link.beat_interval(20.0, {}) == link.BEAT_INTERVAL


def test_a_heartbeat_is_taken_off_a_line_and_the_text_before_it_handed_back():
    end = link.DriverEnd(None, talks=False)
    assert end.heard_in("hello\n") is None
    assert (end.heard, end.talks) == (None, False)
    assert end.heard_in(link.ALIVE_LINE + "\n") == ""
    assert end.talks
    assert end.heard is not None
    # a progress bar without its newline, then a beat: the bar's text comes back to be joined
    assert end.heard_in("\r 50%|####" + link.ALIVE_LINE + "\n") == "\r 50%|####"
    assert end.heard_in(link.ALIVE_LINE) == ""  # the last line, without a newline


def test_the_driver_end_writes_beats_and_requests_only_to_a_child_that_talks():
    read, write = os.pipe()
    stdin = os.fdopen(write, "wb")
    try:
        end = link.DriverEnd(stdin, talks=False)
        end.beat()
        end.stop()  # it does not speak the link: end-of-file, no request
        assert os.read(read, 100) == b""
    finally:
        os.close(read)
    read, write = os.pipe()
    stdin = os.fdopen(write, "wb")
    try:
        end = link.DriverEnd(stdin, talks=False)
        end.heard_in(link.ALIVE_LINE + "\n")  # its first beat: from now on it is spoken to
        end.beat()
        end.stop()
        end.beat()  # no beats once it was asked to stop: the child listens on for a kill request
        assert end.kill()
        assert os.read(read, 100) == b"\n" + link.STOP_REQUEST + b"\n" + link.KILL_REQUEST + b"\n"
        assert os.read(read, 100) == b""  # and its stdin closed after the kill request
    finally:
        os.close(read)


def test_silence_is_judged_once_and_only_after_a_first_beat(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(link.time, "monotonic", lambda: now[0])
    end = link.DriverEnd(None)
    now[0] += 50
    assert not end.check_silence(5.0)  # never heard: not judged
    end.heard_in(link.ALIVE_LINE + "\n")
    now[0] += 5.0
    assert not end.check_silence(5.0)
    now[0] += 0.5
    assert end.check_silence(5.0)
    assert end.silent_for == pytest.approx(5.5)
    assert not end.check_silence(5.0)  # once


#: A child speaking the link: stops (exit 143) after SIGTERM, and has a child of its own that ignores it.
CHILD = """
import os, signal, subprocess, sys, time
from ringtrain.launch import link
signal.signal(signal.SIGTERM, lambda *_: None)  # a stubborn child: only the hard exit ends it
grandchild = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); time.sleep(600)"], start_new_session=True,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(grandchild.pid, flush=True)
pid = os.getpid()
link.watch_driver(float(sys.argv[1]), "hostX", ranks=lambda: [*link.live_children(pid), pid],
                  after_stop=link.exit_after(float(sys.argv[2])), whose="this worker")
link.beat_to_driver(0.2)
while True:
    time.sleep(1)
"""


def start_child(silence_s: float, grace_s: float, tmp: Path | None = None) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(silence_s), str(grace_s)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


def finish(proc: subprocess.Popen, grandchild: int) -> None:
    for pid in (proc.pid, grandchild):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_a_kill_request_kills_the_child_and_its_children_at_once():
    proc, grandchild = start_child(silence_s=600, grace_s=600)
    try:
        assert link.ALIVE_LINE in proc.stderr.readline().decode()  # it beats
        proc.stdin.write(link.STOP_REQUEST + b"\n")
        proc.stdin.flush()
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)  # it ignores the stop: the grace (600 s here) runs
        proc.stdin.write(link.KILL_REQUEST + b"\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert wait_until(lambda: not alive(grandchild))
    finally:
        finish(proc, grandchild)


@pytest.mark.slow
def test_a_signal_request_goes_to_the_child_and_its_children():
    proc, grandchild = start_child(silence_s=600, grace_s=600)
    try:
        assert link.ALIVE_LINE in proc.stderr.readline().decode()  # it beats
        end = link.DriverEnd(proc.stdin)
        assert end.forward(signal.SIGUSR1)
        assert proc.wait(timeout=30) == -signal.SIGUSR1  # neither handles it: its default ends them
        assert wait_until(lambda: not alive(grandchild))
    finally:
        finish(proc, grandchild)


def test_a_signal_request_naming_no_signal_is_ignored():
    sent = []
    link.forward_request(b"signal SIGNOPE", lambda: sent.append("asked") or [])
    assert sent == []


@pytest.mark.slow
def test_a_silent_driver_stops_the_child_which_exits_after_its_grace(tmp_path):
    proc, grandchild = start_child(silence_s=1, grace_s=1, tmp=tmp_path)
    try:
        proc.stdin.write(b"\n")  # one beat: from now on the driver's silence counts
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        err = proc.stderr.read().decode()
        assert ("host hostX: no word from the launcher for 1 s (RINGTRAIN_PEER_TIMEOUT_SECONDS): its host is "
                "unreachable or the network to it is cut; stopping this worker.") in err
        # across a cut link that line reaches nobody: the host keeps it in its log too
        noted = (tmp_path / f"ringtrain-agents-{os.getuid()}.log").read_text()
        assert f"host hostX pid {proc.pid}: no word from the launcher for 1 s" in noted
    finally:
        finish(proc, grandchild)


@pytest.mark.slow
def test_end_of_file_stops_a_child_that_never_heard_a_beat(tmp_path):
    proc, grandchild = start_child(silence_s=1, grace_s=1, tmp=tmp_path)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=3)  # three times the limit without a beat: silence is not judged
        proc.stdin.close()
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert "the launcher closed the link" in proc.stderr.read().decode()
        noted = (tmp_path / f"ringtrain-agents-{os.getuid()}.log").read_text()
        assert "the launcher closed the link" in noted
    finally:
        finish(proc, grandchild)


def test_live_children_sees_a_running_child_but_not_a_zombie():
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert child.pid in link.live_children(os.getpid())
    finally:
        child.kill()
    assert wait_until(lambda: child.pid not in link.live_children(os.getpid()), timeout=10)
    child.wait()
