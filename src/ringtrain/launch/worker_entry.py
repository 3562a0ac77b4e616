"""First code of every worker: add Horovod's variables to the agent's, then become the user's command.

Started by the elastic agent as ``python -m ringtrain.launch.worker_entry COMMAND...``. The agent sets
only torch's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); this module derives HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*/HOSTNAME from them.

A Python command (``python script.py``, ``python -m module``, a bare ``script.py``) runs in this very
process, so an uncaught exception is written to the agent's error file (the launcher's root-cause
report shows its traceback). Any other program replaces this process through ``os.execvp``, which
keeps the pid: signals from the agent and exit codes reach the real program unchanged.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import runpy
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping, MutableMapping, Sequence

from ringtrain.engine import rank_env
from ringtrain.watch.probe import WATCH_DIR_VARIABLE

#: Set for the workers of ``ringtrain run --no-python``: the command is exec'd as it is. Not a
#: ``RINGTRAIN_<DEST>`` flag variable, so a ``ringtrain run`` that a worker starts does not inherit the flag.
NO_PYTHON_VARIABLE = "RINGTRAIN_WORKER_NO_PYTHON"
#: Set by the agent for its ranks: its pid. A rank learns that its agent died when its parent changes;
#: comparing with pid 1 would miss an orphan adopted by a subreaper (a container's init, ``systemd
#: --user``), and reading its parent at start-up would take the subreaper for the agent if the agent
#: died first.
AGENT_PID_VARIABLE = "RINGTRAIN_AGENT_PID"
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


def horovod_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """HOROVOD_* values for a worker, from the torch variables its agent set.

    Slot counts of every node come from RINGTRAIN_NODE_SLOTS (set by ``ringtrain run`` when nodes
    differ); without it all nodes are assumed to run LOCAL_WORLD_SIZE ranks.
    """
    rank = int(environ["RANK"])
    size = int(environ["WORLD_SIZE"])
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    local_size = int(environ.get("LOCAL_WORLD_SIZE", "1"))
    node_rank = int(environ.get("GROUP_RANK", "0"))
    num_nodes = int(environ.get("GROUP_WORLD_SIZE", "1"))
    slots_text = environ.get("RINGTRAIN_NODE_SLOTS", "")
    slots = [int(s) for s in slots_text.split(",")] if slots_text else [local_size] * num_nodes
    holders = [i for i, s in enumerate(slots) if s > local_rank]
    cross_rank = holders.index(node_rank) if node_rank in holders else node_rank
    cross_size = len(holders) if node_rank in holders else num_nodes
    hosts = [h for h in environ.get("RINGTRAIN_NODE_HOSTS", "").split(",") if h]
    hostname = hosts[node_rank] if node_rank < len(hosts) else socket.gethostname()
    return rank_env.horovod_variables(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                                      cross_rank=cross_rank, cross_size=cross_size, hostname=hostname)

def is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` or this interpreter's own path."""
    return bool(_PYTHON_NAME.match(os.path.basename(program))) or program == sys.executable


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` without the frames of this module and of runpy (ours, not the user's)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or tb.tb_frame.f_code.co_filename.endswith("runpy.py")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def write_error_file(exc: BaseException, environ: MutableMapping[str, str]) -> bool:
    """Record ``exc`` where the elastic agent looks for it (its JSON layout), for the root-cause report.

    Returns whether it was recorded (False outside an agent, or when the file cannot be written).
    """
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": user_traceback(exc),
                                      "timestamp": str(int(time.time())),
                                      "time": repr(time.time())}}}
    # Through a temporary file: a rank killed mid-write (its agent stops it once another rank failed)
    # must not leave half a JSON file, which the agent could not read.
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "w") as fp:
            json.dump(data, fp)
        os.replace(temp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(temp)
        return False
    return True


def run_python(argv: Sequence[str]) -> int:
    """Run ``script.py args`` / ``-m module args`` / ``-c code args`` here, recording an uncaught error."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if write_error_file(exc, os.environ):
            # The launcher's failure report shows the traceback; printing it here as well showed it twice.
            # One line still marks, among this rank's own output, where it failed.
            sys.stderr.write(error_line(exc))
        else:
            sys.stderr.write(user_traceback(exc))
        sys.stderr.flush()
        return 1
    return 0


def error_line(exc: BaseException) -> str:
    """The one line a rank prints where it failed, its error being in the launcher's report.

    A rank that failed because another one failed first (its engine shut down under it, its peer's
    connection closed: :func:`ringtrain.launch.report.because_of_another_rank`) is not the root cause,
    whose traceback the report shows: its line says so instead of pointing at its own traceback, which
    the report does not show (and which a job that recovered by a restart does not report at all).
    """
    from ringtrain.launch.report import because_of_another_rank

    first_line = (str(exc).splitlines() or [""])[0]
    if because_of_another_rank(f"{type(exc).__name__}: {exc}"):
        return (f"{type(exc).__name__}: {first_line} "
                "(because another rank failed or stopped first; see the launcher's report)\n")
    return f"{type(exc).__name__}: {first_line} (traceback in the launcher's failure report)\n"


_PR_SET_PDEATHSIG = 1


def agent_pid(environ: MutableMapping[str, str]) -> int:
    """The pid of the agent that started this rank (taken out of ``environ``), else the parent's."""
    value = environ.pop(AGENT_PID_VARIABLE, "")
    return int(value) if value.isdigit() else os.getppid()


def die_with_parent(parent: int | None = None) -> bool:
    """Ask the kernel for SIGTERM when the agent that started us dies (Linux; False elsewhere).

    The agent stops its workers itself on SIGTERM/SIGINT, but SIGKILL (an out-of-memory kill, a
    scheduler's hard stop, ``kill -9`` of the launcher) gives it no chance: without this, its ranks
    would keep running, holding GPUs and ports. The request survives ``exec``, so it also covers
    non-Python commands. ``parent`` is the agent's pid (default: the parent's now): if the parent is
    no longer that process once the request is in place, the agent died first and we end at once.
    """
    if not sys.platform.startswith("linux"):
        return False
    if parent is None:
        parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        # The agent died before the request took effect.
        os.kill(os.getpid(), signal.SIGTERM)
    return True


#: Seconds a Python rank whose agent died may live on (its own SIGTERM handling, a last checkpoint)
#: before it is ended; the agent gives its ranks as long when it stops them itself.
ORPHAN_GRACE_S = 30.0


def end_when_orphaned(agent: int, grace_s: float = ORPHAN_GRACE_S, poll_s: float = 1.0) -> threading.Thread:
    """End this process ``grace_s`` after its parent ``agent`` is gone, whatever it does with SIGTERM.

    The kernel's parent-death signal is SIGTERM, which a script may ignore or handle by carrying on
    (and a rank blocked in a C call handles it only once the call returns): such a rank would outlive
    its job, holding its GPU and ports. A thread is beyond the script's signal settings. It lasts
    until ``exec``, so commands that are not Python get the kernel's signal alone.
    """
    def watch() -> None:
        while os.getppid() == agent:
            time.sleep(poll_s)
        time.sleep(grace_s)
        with contextlib.suppress(Exception):
            sys.stderr.write(f"ringtrain: this rank's launcher ended {grace_s:g} s ago; ending the rank.\n")
            sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="ringtrain-orphan-watch", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    """Set the Horovod variables, then run or exec the command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("ringtrain.launch.worker_entry: no command given", file=sys.stderr)
        return 2
    agent = agent_pid(os.environ)
    die_with_parent(agent)
    if sys.platform.startswith("linux"):
        end_when_orphaned(agent)
    os.environ.update(horovod_variables(os.environ))
    bind_to_cores(os.environ)
    return run_command(argv)


def bind_to_cores(environ: Mapping[str, str]) -> None:
    """``RINGTRAIN_BIND`` before the command starts a thread, for any script (exec keeps the mask)."""
    if "RINGTRAIN_BIND" not in environ:
        return  # the default, none: not worth importing the settings (60 ms) into every rank
    from ringtrain.engine.settings import read_knob
    from ringtrain.env.binding import bind_rank
    from ringtrain.exceptions import SettingError

    try:
        setting = read_knob("bind", environ)
    except SettingError:
        return  # the launcher refuses a bad value before any rank starts; hvd.init() names it too
    bind_rank(setting, environ)


def runs_in_process(argv: list[str], environ: Mapping[str, str] | None = None) -> bool:
    """Whether :func:`run_command` runs ``argv`` in this very process (a Python program with a script,
    ``-m`` or ``-c``) rather than exec'ing it."""
    environ = os.environ if environ is None else environ
    program, rest = argv[0], argv[1:]
    if environ.get(NO_PYTHON_VARIABLE, "") == "1":  # --no-python: the command runs as it is
        return False
    if is_python(program) and rest and (rest[0] in ("-m", "-c") or not rest[0].startswith("-")):
        return not (rest[0] in ("-m", "-c") and len(rest) < 2)
    return program.endswith(".py")


def run_command(argv: list[str]) -> int:
    """Run a rank's command: a Python program in this very process, anything else by exec."""
    program, rest = argv[0], argv[1:]
    in_process = runs_in_process(argv)
    if os.environ.pop(NO_PYTHON_VARIABLE, "") == "1":  # --no-python: the command runs as it is
        os.execvp(program, [program, *rest])
    if in_process:
        # A rank that crashes in native code (a segfault, an abort) shows where each of its Python
        # threads was, in its output, which the launcher's failure report quotes; the Trainer's ranks
        # get the same from torch's @record.
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
        if WATCH_DIR_VARIABLE in os.environ:  # the agent watches for a stuck job (ringtrain.watch)
            from ringtrain.watch import probe

            probe.start()
        return run_python(rest if is_python(program) else argv)
    if is_python(program):
        program = sys.executable
    os.execvp(program, [program, *rest])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
