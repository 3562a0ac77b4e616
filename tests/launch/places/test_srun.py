"""The srun place (launch/places/srun.py): one task per node, srun's own streams and signals."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ringtrain.launch.places import PLACES, SrunStep
from ringtrain.launch.places.srun import srun_command


def test_one_task_per_node_and_a_failing_task_ends_the_step():
    assert srun_command(3, ["python", "-m", "x"]) == [
        "srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "python", "-m", "x"]


def test_srun_shares_our_streams_and_session_and_stop_passes_it_a_sigint(tmp_path: Path):
    ready = tmp_path / "ready"
    # stands for srun: it reports SIGINT with its own exit code, as srun passes the stop on to its tasks
    fake = (f"import pathlib, signal, sys, time\n"
            f"signal.signal(signal.SIGINT, lambda *_: sys.exit(7))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            f"time.sleep(600)\n")
    step = PLACES["srun"]("srun", [sys.executable, "-c", fake], dict(os.environ))
    assert isinstance(step, SrunStep)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.getpgid(step.pid) == os.getpgrp()  # a Ctrl-C at a terminal reaches it as it reaches us
        assert step.proc.stdout is None
        assert step.proc.stdin is None
        step.stop()
        assert step.wait(timeout=60) == 7
    finally:
        if step.poll() is None:
            os.kill(step.pid, signal.SIGKILL)
            step.wait()
