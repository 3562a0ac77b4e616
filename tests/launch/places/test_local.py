"""The local place (launch/places/local.py): a child process here, with the environment it is given."""

from __future__ import annotations

import io
import signal
import sys
import time

from ringtrain.launch.places import PLACES, LocalGroup


def test_the_table_names_each_place_by_its_kind():
    assert PLACES["local"] is LocalGroup
    assert all(cls.kind == name for name, cls in PLACES.items())
    assert set(PLACES) == {"local", "ssh", "srun", "ray", "ray-bridged"}


def test_the_child_gets_exactly_the_environment_given():
    out = io.StringIO()
    code = "import os; print(sorted(k for k in os.environ if k.startswith('RT_')))"
    env = {"RT_ONE": "1", "RT_TWO": "2", "PATH": "/usr/bin:/bin"}
    g = LocalGroup("here", [sys.executable, "-c", code], env, out=out)
    assert g.wait(timeout=60) == 0
    g.join_output(timeout=10)
    assert out.getvalue() == "['RT_ONE', 'RT_TWO']\n"


def test_stop_reaches_a_child_that_never_reads_its_stdin():
    out = io.StringIO()
    g = LocalGroup("here", [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"],
                   None, talks=False, out=out)
    deadline = time.monotonic() + 60
    while out.getvalue() != "ready\n" and time.monotonic() < deadline:
        time.sleep(0.05)
    g.stop()  # SIGTERM to its process group: it does not have to read anything
    assert g.wait(timeout=60) == -signal.SIGTERM
