"""Stopping on a signal (launch/stopping.py): announced, a second Ctrl-C kills, a watchdog bounds it."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from ringtrain.launch.stopping import REPEAT_AFTER_S, STOP_SIGNALS, StopGuard
from tests.processes import alive

# A rank that ignores every stop signal, as one stuck in a C call or a careless script does.
STUBBORN = ("import signal, sys, time\n"
            "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    time.sleep(1)\n")


class _Stopped(Exception):
    """What the wrapped handler (torch's, in the agent) raises."""


def _raise_stopped(_signum: int, _frame: object) -> None:
    raise _Stopped


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    yield proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture
def torch_handlers() -> Iterator[None]:
    """Handlers that raise, as torch's agent installs them; put back what pytest had afterwards."""
    saved = {getattr(signal, n): signal.getsignal(getattr(signal, n)) for n in STOP_SIGNALS}
    for signum in saved:
        signal.signal(signum, _raise_stopped)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_signal_is_announced_and_reaches_torchs_handler_the_ranks_live_on(rank, torch_handlers):
    out = io.StringIO()
    guard = StopGuard(lambda: [rank.pid], out=out, limit_s=600)
    guard.install()
    with pytest.raises(_Stopped):
        os.kill(os.getpid(), signal.SIGINT)
    guard.finish()
    assert guard.signum == signal.SIGINT
    assert "SIGINT: stopping the ranks (they get 30 s; press Ctrl-C again to kill them now)" in out.getvalue()
    assert rank.poll() is None  # torch's shutdown sends the signal, then SIGKILL after its grace


def test_a_second_signal_kills_the_ranks_at_once_but_a_duplicate_of_the_first_does_not(rank, torch_handlers):
    out, clock = io.StringIO(), _Clock()
    guard = StopGuard(lambda: [rank.pid], out=out, clock=clock, limit_s=600)
    guard.install()
    guard.install()  # again after a restart: wrapped once, not twice
    with pytest.raises(_Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
    assert "send SIGTERM again to kill them now" in out.getvalue()
    os.kill(os.getpid(), signal.SIGINT)  # within REPEAT_AFTER_S: the same stop, delivered twice
    assert rank.poll() is None
    clock.now += REPEAT_AFTER_S
    os.kill(os.getpid(), signal.SIGINT)  # no exception raised inside torch's shutdown this time
    assert rank.wait(timeout=60) == -signal.SIGKILL
    guard.finish()
    assert "SIGINT again: killing the ranks now." in out.getvalue()


def test_an_agent_started_by_a_driver_neither_announces_nor_escalates(rank, torch_handlers):
    out, clock = io.StringIO(), _Clock()
    guard = StopGuard(lambda: [rank.pid], interactive=False, out=out, clock=clock, limit_s=600)
    guard.install()
    with pytest.raises(_Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
    clock.now += 10
    os.kill(os.getpid(), signal.SIGTERM)
    guard.finish()
    assert out.getvalue() == ""
    assert rank.poll() is None


def test_the_watchdog_ends_a_stop_that_hangs_with_the_stacks_killed_ranks_and_the_exit_code(tmp_path):
    """The agent's main thread is stuck after the signal (here on a lock nobody releases)."""
    script = tmp_path / "stuck.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, threading
        from ringtrain.launch.stopping import StopGuard, at_forced_exit
        rank = subprocess.Popen([sys.executable, "-c", {STUBBORN!r}], stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        assert rank.stdout.readline() == "ready\\n"
        print(rank.pid, flush=True)

        class Stopped(Exception):
            pass

        def torch_handler(signum, frame):
            raise Stopped

        signal.signal(signal.SIGINT, torch_handler)
        guard = StopGuard(lambda: [rank.pid], limit_s=1.0)
        guard.install()
        with at_forced_exit(lambda signum: print(f"forced exit on {{signum}}", file=sys.stderr)):
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except Stopped:
                lock = threading.Lock()
                lock.acquire()
                lock.acquire()  # the hang
        print("not reached", flush=True)
        """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    rank_pid = int(proc.stdout.split()[0])
    assert "not reached" not in proc.stdout
    assert "still stopping 1 s after SIGINT; the stack of every thread follows" in proc.stderr
    assert "most recent call first" in proc.stderr  # faulthandler's dump
    assert "stuck.py" in proc.stderr
    assert f"forced exit on {int(signal.SIGINT)}" in proc.stderr
    deadline = time.monotonic() + 60
    while alive(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(rank_pid)


def _lines(stream: io.TextIOBase) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue[str], needle: str, seen: list[str]) -> None:
    while True:
        line = lines.get(timeout=120)
        seen.append(line)
        assert line, f"ended before {needle!r}: {''.join(seen)}"
        if needle in line:
            return


@pytest.mark.slow
def test_ringtrain_run_a_second_ctrl_c_kills_ranks_that_ignore_the_first(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli.main", "run", "-np", "2", sys.executable,
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = _lines(proc.stdout), _lines(proc.stderr)
        seen_out: list[str] = []
        for _ in range(2):
            _wait_for(out, "ready", seen_out)
        proc.send_signal(signal.SIGINT)
        seen_err: list[str] = []
        _wait_for(err, "SIGINT: stopping the ranks", seen_err)
        time.sleep(REPEAT_AFTER_S + 0.2)  # a second press, not the first delivered twice
        proc.send_signal(signal.SIGINT)
        # The ranks ignore SIGINT: without the second press they would live out torch's 30 s grace.
        assert proc.wait(timeout=20) == 128 + signal.SIGINT
        _wait_for(err, "SIGINT again: killing the ranks now", seen_err)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
