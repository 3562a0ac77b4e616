"""HOROVOD_* variables derived from the elastic agent's variables, and a rank's end with its agent."""

import os
import signal
import subprocess
import sys
import time

import pytest

from ringtrain.launch.worker_entry import (
    AGENT_PID_VARIABLE,
    NO_PYTHON_VARIABLE,
    agent_pid,
    horovod_variables,
    is_python,
    runs_in_process,
)
from tests.processes import alive


def test_single_node_variables():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
           "GROUP_WORLD_SIZE": "1", "RINGTRAIN_NODE_HOSTS": "alpha"}
    got = horovod_variables(env)
    assert got["HOROVOD_RANK"] == "1"
    assert got["HOROVOD_SIZE"] == "2"
    assert got["HOROVOD_LOCAL_RANK"] == "1"
    assert got["HOROVOD_LOCAL_SIZE"] == "2"
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("0", "1")
    assert got["HOROVOD_HOSTNAME"] == "alpha"
    assert got["HOROVOD_CONTROLLER"] == "gloo"
    assert got["PYTHONUNBUFFERED"] == "1"


def test_uneven_nodes_cross_rank_counts_only_nodes_with_that_local_rank():
    # Nodes with 2, 1 and 2 slots: local rank 1 exists on nodes 0 and 2 only.
    env = {"RANK": "4", "WORLD_SIZE": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
           "GROUP_WORLD_SIZE": "3", "RINGTRAIN_NODE_SLOTS": "2,1,2", "RINGTRAIN_NODE_HOSTS": "a,b,c"}
    got = horovod_variables(env)
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("1", "2")
    assert got["HOROVOD_HOSTNAME"] == "c"


def test_homogeneous_nodes_without_slot_list():
    env = {"RANK": "5", "WORLD_SIZE": "6", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2",
           "GROUP_WORLD_SIZE": "3"}
    got = horovod_variables(env)
    assert (got["HOROVOD_CROSS_RANK"], got["HOROVOD_CROSS_SIZE"]) == ("2", "3")


def test_python_names():
    assert is_python("python")
    assert is_python("python3")
    assert is_python("/usr/bin/python3.11")
    assert not is_python("pythonista")
    assert not is_python("bash")


@pytest.mark.parametrize(("argv", "here"), [
    (["python", "train.py", "--lr", "1"], True),
    (["python3", "-m", "pkg.train"], True),
    (["python", "-c", "pass"], True),
    (["train.py"], True),
    (["python", "-m"], False),  # exec'd: Python itself says what is missing
    (["python", "-u", "train.py"], False),  # an interpreter flag first: exec'd as given
    (["python"], False),
    (["bash", "run.sh"], False),
])
def test_runs_in_process_says_which_commands_run_here_and_which_are_execd(argv, here):
    assert runs_in_process(argv, {}) is here
    assert runs_in_process(argv, {NO_PYTHON_VARIABLE: "1"}) is False  # --no-python: always exec'd


def test_the_error_file_is_never_left_half_written(tmp_path, monkeypatch):
    """A rank stopped mid-write (here: the disk fills up) leaves no half JSON where the agent reads."""
    import json

    from ringtrain.launch import worker_entry

    def half_then_fail(data, fp):
        fp.write(json.dumps(data)[:20])
        raise OSError("No space left on device")

    monkeypatch.setattr(worker_entry.json, "dump", half_then_fail)
    path = tmp_path / "error.json"
    assert worker_entry.write_error_file(ValueError("x"), {"TORCHELASTIC_ERROR_FILE": str(path)}) is False
    assert list(tmp_path.iterdir()) == []


def test_the_error_file_holds_the_exception(tmp_path):
    import json

    from ringtrain.launch.worker_entry import write_error_file

    path = tmp_path / "error.json"
    try:
        raise ValueError("boom")
    except ValueError as exc:
        error = exc
    assert write_error_file(error, {"TORCHELASTIC_ERROR_FILE": str(path)}) is True
    body = json.loads(path.read_text())
    assert body["message"]["message"] == "ValueError: boom"
    assert "raise ValueError" in body["message"]["extraInfo"]["py_callstack"]
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]


@pytest.mark.parametrize(("code", "line"), [
    pytest.param("raise RuntimeError('boom at step 5\\nsecond line')",
                 "RuntimeError: boom at step 5 (traceback in the launcher's failure report)", id="own-error"),
    pytest.param("from ringtrain.exceptions import HorovodInternalError\n"
                 "raise HorovodInternalError('Mismatched allreduce tensor shapes: One rank sent [2], but "
                 "another rank sent [3].')",
                 "HorovodInternalError: Mismatched allreduce tensor shapes: One rank sent [2], but another "
                 "rank sent [3]. (traceback in the launcher's failure report)", id="own-engine-error"),
    pytest.param("from ringtrain.engine.background import SHUT_DOWN_MESSAGE\n"
                 "from ringtrain.exceptions import HorovodInternalError\n"
                 "raise HorovodInternalError(SHUT_DOWN_MESSAGE)",
                 "HorovodInternalError: Horovod has been shut down. This was caused by an exception on one "
                 "of the ranks", id="engine-shut-down"),
    pytest.param("raise RuntimeError('[gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                 "[127.0.0.1]:40123')",
                 "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123 "
                 "(because another rank failed or stopped first; see the launcher's report)",
                 id="peer-closed"),
])
def test_a_python_rank_that_failed_prints_one_line_that_says_whether_its_error_is_its_own(
        code, line, tmp_path, monkeypatch, capsys):
    # the root cause's traceback is in the launcher's report; a rank that failed because another one
    # did (a survivor of a restart too, whose own error the launcher reports nowhere) says so instead
    from ringtrain.launch.worker_entry import run_python

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert run_python(["-c", code]) == 1
    printed = capsys.readouterr().err.splitlines()
    assert len(printed) == 1
    assert printed[0].startswith(line)
    own = "(traceback in the launcher's failure report)"
    assert printed[0].endswith(own if own in line else
                               "(because another rank failed or stopped first; see the launcher's report)")
    assert (tmp_path / "error.json").exists()  # the report still learns why it failed


# The agent: starts a rank that ignores SIGTERM (the kernel's parent-death signal) and watches for
# being orphaned with a short grace, prints the rank's pid, then waits to be killed.
_AGENT = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", '''
import os, signal, time
from ringtrain.launch.worker_entry import end_when_orphaned
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
end_when_orphaned(os.getppid(), grace_s=0.5, poll_s=0.05)
print(os.getpid(), flush=True)
while True:
    time.sleep(1)
'''], stdout=subprocess.PIPE, text=True, start_new_session=True)
print(rank.stdout.readline().strip(), flush=True)
rank.wait()
"""


def test_a_rank_that_ignores_sigterm_still_ends_after_its_agent_is_killed():
    agent = subprocess.Popen([sys.executable, "-c", _AGENT], stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None
    rank = int(agent.stdout.readline())
    try:
        assert alive(rank)
        agent.send_signal(signal.SIGKILL)  # an OOM kill or kill -9 of the launcher
        agent.wait()
        deadline = time.monotonic() + 60
        while alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(rank)
    finally:
        if alive(rank):
            os.kill(rank, signal.SIGKILL)


def test_agent_pid_comes_from_the_agent_and_is_not_passed_on():
    env = {AGENT_PID_VARIABLE: "4242"}
    assert agent_pid(env) == 4242
    assert AGENT_PID_VARIABLE not in env  # a ringtrain run the rank starts sets its own
    assert agent_pid({}) == os.getppid()
    assert agent_pid({AGENT_PID_VARIABLE: "not a pid"}) == os.getppid()


# A subreaper (as a container's init is) starts an agent that starts a rank and dies before the
# rank's worker_entry runs: the rank is adopted by the subreaper, not by pid 1. It must end at once
# (SIGTERM), not take the subreaper for its agent and run on. The subreaper reaps every child it
# gets and prints how the rank ended.
_SUBREAPER = """
import ctypes, os, subprocess, sys
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
agent = subprocess.Popen([sys.executable, "-c", '''
import os, subprocess, sys
env = {**os.environ, "RINGTRAIN_AGENT_PID": str(os.getpid()), "RANK": "0", "WORLD_SIZE": "1",
       "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}
# The rank waits for this agent to be gone, then becomes worker_entry (exec keeps its pid).
subprocess.Popen(["sh", "-c", 'while kill -0 "$0" 2>/dev/null; do sleep 0.01; done; exec "$@"',
                  str(os.getpid()), sys.executable, "-m", "ringtrain.launch.worker_entry",
                  sys.executable, "-c", "import time; time.sleep(30)"], env=env)
'''])
agent.wait()
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    print("signal" if os.WIFSIGNALED(status) else "exit", os.WTERMSIG(status) if os.WIFSIGNALED(status)
          else os.WEXITSTATUS(status), flush=True)
"""


def test_a_rank_whose_agent_died_before_it_started_ends_under_a_subreaper():
    done = subprocess.run([sys.executable, "-c", _SUBREAPER], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == f"signal {int(signal.SIGTERM)}", done.stdout + done.stderr


_CRASH = """
import ctypes

def read_nowhere():
    return ctypes.string_at(0)  # a segfault in native code

read_nowhere()
"""


def test_a_python_rank_that_crashes_in_native_code_shows_its_python_stack(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(_CRASH)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    env.pop("PYTHONFAULTHANDLER", None)
    done = subprocess.run([sys.executable, "-m", "ringtrain.launch.worker_entry", "python", str(script)],
                          capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert f'File "{script}", line 5 in read_nowhere' in done.stderr
