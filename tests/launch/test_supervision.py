"""The supervision layer (launch/supervision.py): a group's output, tail, status, stop, kill and liveness,
the drivers' stop signals, and stopping every group within the grace. Groups here are local processes;
the places themselves have their tests under tests/launch/places/."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading

import pytest

from ringtrain.launch import link, supervision
from ringtrain.launch.places import PLACES
from ringtrain.launch.stopping import REPEAT_AFTER_S
from tests.processes import alive, wait_until


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def group(code: str, **kwargs) -> supervision.ProcessGroup:
    return PLACES["local"]("here", python(code), None, **kwargs)


def test_output_is_relayed_line_by_line_and_the_stderr_tail_kept_without_heartbeats():
    out, err = io.StringIO(), io.StringIO()
    code = ("import sys\n"
            "print('[0] out one'); print('[1] out two')\n"
            "for i in range(30): print(f'[0] err {i}', file=sys.stderr)\n"
            f"sys.stderr.write('[1] partial'); sys.stderr.write({link.ALIVE_LINE + chr(10)!r}); "
            "sys.stderr.write(' rest\\n')\n"
            "sys.exit(3)\n")
    g = group(code, out=out, err=err)
    assert g.wait(timeout=60) == 3
    g.join_output(timeout=10)
    assert g.poll() == 3
    assert g.ended_at is not None
    assert out.getvalue() == "[0] out one\n[1] out two\n"
    assert link.ALIVE_LINE not in err.getvalue()
    # the heartbeat written mid-line leaves that line whole
    assert err.getvalue().endswith("[0] err 29\n[1] partial rest\n")
    assert len(g.tail) == supervision.TAIL_LINES
    assert g.tail[-1] == "[1] partial rest\n"
    assert g.last_error() == "[1] partial rest"
    assert g.link.heard is not None  # the beat was heard


def test_a_hook_takes_lines_off_the_console_and_the_tail():
    err = io.StringIO()
    taken: list[str] = []

    def take(line: str) -> bool:
        if line.startswith("MARK"):
            taken.append(line)
            return True
        return False

    g = group("import sys; print('MARK 1', file=sys.stderr); print('plain', file=sys.stderr)",
              on_error_line=take, err=err)
    g.wait(timeout=60)
    g.join_output(timeout=10)
    assert taken == ["MARK 1\n"]
    assert err.getvalue() == "plain\n"
    assert g.tail == ["plain\n"]


def test_how_an_ended_group_is_described():
    g = group("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    g.wait(timeout=60)
    assert g.describe_end("the agent of node 1") == "the agent of node 1 on host here was killed by SIGKILL"
    g = group("pass")
    g.wait(timeout=60)
    assert g.describe_end("the agent of node 1") == "the agent of node 1 (local) ended without a report"
    assert not g.unreachable()


def test_a_group_that_never_beats_gets_end_of_file_as_its_stop_and_is_killed_for_kill_ranks():
    # the child reads stdin: end-of-file is its stop; it never beats, so nothing else reaches it
    out = io.StringIO()
    g = group("import sys, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print('ready', flush=True); print(repr(sys.stdin.read()))", talks=False, out=out)
    assert wait_until(lambda: out.getvalue().startswith("ready"))
    g.beat()
    g.stop()
    assert g.wait(timeout=60) == 0
    g.join_output(timeout=10)
    assert out.getvalue() == "ready\n''\n"  # nothing of ours on its stdin, then end-of-file
    g = group("import time; time.sleep(600)", talks=False)
    g.kill_ranks()
    assert g.wait(timeout=60) == -signal.SIGKILL


def test_silence_of_a_group_that_beat_once_is_noticed_once():
    g = group(f"import sys, time; print({link.ALIVE_LINE!r}, file=sys.stderr, flush=True); time.sleep(600)")
    try:
        assert wait_until(lambda: g.link.heard is not None)
        assert not g.check_silence(60.0)
        assert wait_until(lambda: g.check_silence(0.2))
        assert g.silent_for is not None
        assert g.silent_for > 0.2
        assert not g.check_silence(0.2)
    finally:
        g.kill()
        g.wait(timeout=60)


def test_stop_signals_a_second_one_soon_after_is_the_first_delivered_twice():
    now = [0.0]
    signals = supervision.StopSignals(clock=lambda: now[0])
    assert (signals.first, signals.kill) == (None, None)
    signals.on_signal(signal.SIGINT)
    now[0] += REPEAT_AFTER_S / 2
    signals.on_signal(signal.SIGINT)
    assert (signals.first, signals.kill) == (signal.SIGINT, None)
    now[0] += REPEAT_AFTER_S
    signals.on_signal(signal.SIGTERM)
    assert (signals.first, signals.kill) == (signal.SIGINT, signal.SIGTERM)


def test_stop_signals_install_their_handler_and_put_the_old_one_back():
    before = signal.getsignal(signal.SIGHUP)
    with supervision.StopSignals() as signals:
        assert signal.getsignal(signal.SIGHUP) == signals.on_signal
        signal.raise_signal(signal.SIGHUP)
        assert signals.first == signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) == before


def test_pulse_beats_every_group_at_most_once_an_interval():
    class Counting:
        beats = 0

        def beat(self) -> None:
            self.beats += 1

    groups = [Counting(), Counting()]
    pulse = supervision.Pulse(interval=3600)
    pulse(groups)  # type: ignore[arg-type]
    pulse(groups)  # type: ignore[arg-type]
    assert [g.beats for g in groups] == [1, 1]


STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(600)")


def stubborn(**kwargs) -> supervision.ProcessGroup:
    """A group that ignores SIGTERM, once it does."""
    out = io.StringIO()
    g = group(STUBBORN, out=out, **kwargs)
    assert wait_until(lambda: out.getvalue() == "ready\n")
    return g


def test_stop_all_kills_what_outlives_the_grace():
    groups = [stubborn(), group("import time; time.sleep(600)")]
    said: list[str] = []
    supervision.stop_all(groups, supervision.StopSignals(), said.append, grace_s=0.5)
    assert [g.poll() for g in groups] == [-signal.SIGKILL, -signal.SIGTERM]
    assert said == []


def test_stop_all_kills_the_ranks_at_once_on_a_second_signal():
    signals = supervision.StopSignals()
    signals.on_signal(signal.SIGINT)
    g = stubborn(talks=False)
    said: list[str] = []
    # the second press comes while the group takes its (here: an hour's) grace
    threading.Timer(REPEAT_AFTER_S + 0.2, signals.on_signal, args=(signal.SIGINT,)).start()
    supervision.stop_all([g], signals, said.append, grace_s=3600)
    assert g.poll() == -signal.SIGKILL
    assert said == ["SIGINT again: killing the ranks on every host now."]
    assert not alive(g.pid)


def test_an_unknown_program_fails_to_start_with_os_error():
    with pytest.raises(OSError):
        PLACES["local"]("here", ["ringtrain-no-such-program-xyz"], None)


def test_a_group_has_a_pid_and_waits_with_a_timeout():
    g = group("import time; time.sleep(600)")
    try:
        assert alive(g.pid)
        with pytest.raises(subprocess.TimeoutExpired):
            g.wait(timeout=0.1)
        assert g.poll() is None
        assert g.ended_at is None
    finally:
        g.kill()
        g.wait(timeout=60)
