"""What a test leaves behind: the checks of conftest's autouse ``hygiene`` fixture.

A :class:`Snapshot` is taken before a test (after the fixtures of wider scope it uses are set up) and
compared with the state after it (after its own function-scoped fixtures are torn down):

* ``env``: ``os.environ`` keys added, removed or changed;
* ``process_group``: a default ``torch.distributed`` process group left initialised;
* ``engine``: ringtrain's Horovod engine (``hvd.init()``) left running;
* ``threads``: non-daemon threads started and still alive;
* ``processes``: child processes of the test process started and still alive (zombies are dead).

Threads and processes get one short grace, :data:`GRACE_S` in all: the check waits on each thread's
``join`` and on each process's pidfd (it becomes readable when the process ends), never sleeps.

Objects that fixtures keep across tests on purpose (the rank pools of conftest's ``ranks2``...,
which start their processes lazily, inside the first test that runs something on them) are registered
with :func:`keep_across_tests`; their processes are not counted.

Everything here must stay cheap: it runs around every test of the contributor's lane.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

#: Every kind of leak checked; ``@pytest.mark.leaks(KIND, ..., reason=...)`` lets a test leave those.
KINDS = ("env", "process_group", "engine", "threads", "processes")

#: Seconds, for all threads and processes together, that a test's leftovers get to end by themselves.
GRACE_S = 2.0


#: Variables that libraries set in the test process themselves, not the tests: pytest rewrites
#: PYTEST_CURRENT_TEST at every phase of every test; torch writes its default TORCHINDUCTOR_CACHE_DIR
#: into os.environ when torch._dynamo is first imported (the first optimizer built imports it:
#: torch/_dynamo/package.py, torch/_inductor/runtime/cache_dir_utils.py), in whichever test builds
#: one first; importing ray sets RAY_CLIENT_MODE=0
#: (ray/_private/client_mode_hook.py), in whichever test imports it first.
#: The value each may take (None: any).
_LIBRARY_VARIABLES: dict[str, str | None] = {
    "PYTEST_CURRENT_TEST": None, "TORCHINDUCTOR_CACHE_DIR": None, "RAY_CLIENT_MODE": "0"}


class KeepsProcesses(Protocol):
    def pids(self) -> Iterable[int]: ...


Owner = TypeVar("Owner", bound=KeepsProcesses)

_kept: weakref.WeakSet[Any] = weakref.WeakSet()


def keep_across_tests(owner: Owner) -> Owner:
    """Register ``owner`` (a fixture's object of session or module scope with a ``pids()`` method):
    the processes it holds outlive tests by design and are never reported as leaked."""
    _kept.add(owner)
    return owner


def _kept_pids() -> set[int]:
    pids = {pid for owner in list(_kept) for pid in owner.pids()}
    # multiprocessing starts these helpers lazily, at the first spawn or semaphore of the session, and
    # keeps them to the end of the interpreter (they are its own, shared by every later Process).
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    if tracker is not None:
        pid = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
        if pid:
            pids.add(pid)
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is not None:
        pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
        if pid:
            pids.add(pid)
    # the snapshot writer of background snapshots: one per process, started at the first save that needs
    # it and kept to the end of the interpreter, like the helpers above
    background = sys.modules.get("ringtrain.train.background_snapshots")
    if background is not None:
        pids.update(background.writer_pids())
    return pids


def child_pids() -> set[int]:
    """The live (not zombie) children of this process, from /proc (every thread's ``children``)."""
    pids: set[int] = set()
    tasks = f"/proc/{os.getpid()}/task"
    for task in os.listdir(tasks):
        try:
            with open(f"{tasks}/{task}/children") as fp:
                pids.update(int(word) for word in fp.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return {pid for pid in pids if _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fp:
            stat = fp.read()
    except OSError:
        return False
    # the state follows the command's closing parenthesis (the command may hold spaces or parentheses)
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fp:
            words = fp.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(word.decode(errors="replace") for word in words if word)
    return text if len(text) <= 120 else text[:117] + "..."


def _wait_process(pid: int, deadline: float) -> bool:
    """True once ``pid`` has ended (waits on its pidfd until ``deadline``)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except OSError:  # no pidfd here: no grace
        return not _alive(pid)
    try:
        if not _alive(pid):
            return True
        readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        return bool(readable) or not _alive(pid)
    finally:
        os.close(fd)


def _thread_text(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    where = getattr(target, "__qualname__", None) or type(thread).__qualname__
    module = getattr(target, "__module__", None) or type(thread).__module__
    return f"{thread.name!r} ({module}.{where})"


def _default_group_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")  # not imported: no group (and torch's import is not paid)
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _engine_running() -> bool:
    state = sys.modules.get("ringtrain.engine.state")
    return state is not None and state.engine is not None


@dataclass
class Snapshot:
    env: dict[str, str]
    process_group: bool
    engine: bool
    threads: set[threading.Thread]
    processes: set[int]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(dict(os.environ), _default_group_initialized(), _engine_running(),
                   set(threading.enumerate()), child_pids())


def leaks(before: Snapshot, allowed: Iterable[str] = ()) -> list[str]:
    """What was left since ``before``, one sentence each (kinds in ``allowed`` are not checked).

    What can be undone without guessing is undone, so that one leaking test does not change the next
    ones: the environment is put back, the process group destroyed, the engine shut down, leftover
    child processes killed.
    """
    allowed = set(allowed)
    found: list[str] = []
    if "env" not in allowed:
        now = dict(os.environ)
        for name, value in _LIBRARY_VARIABLES.items():
            if name in now and value in (None, now[name]):
                del now[name]
                if name in before.env:
                    now[name] = before.env[name]
        if now != before.env:
            added = sorted(now.keys() - before.env.keys())
            removed = sorted(before.env.keys() - now.keys())
            changed = sorted(k for k in now.keys() & before.env.keys() if now[k] != before.env[k])
            parts = [f"{word} {', '.join(names)}" for word, names in
                     (("added", added), ("removed", removed), ("changed", changed)) if names]
            found.append(f"environment variables leaked: {'; '.join(parts)}. HINT: set them with "
                         "monkeypatch.setenv/delenv, or pass env= to the process, not os.environ.")
            for name in added:
                del os.environ[name]
            for name in removed + changed:
                os.environ[name] = before.env[name]
    if "process_group" not in allowed and not before.process_group and _default_group_initialized():
        found.append("a torch.distributed default process group is still initialised. HINT: call "
                     "torch.distributed.destroy_process_group() in a finally (or a fixture's teardown).")
        with contextlib.suppress(Exception):
            sys.modules["torch.distributed"].destroy_process_group()
    if "engine" not in allowed and not before.engine and _engine_running():
        found.append("ringtrain's engine is still running (hvd.is_initialized() is True). HINT: call "
                     "hvd.shutdown() in a finally (or a fixture's teardown).")
        with contextlib.suppress(Exception):
            from ringtrain.ops.basics import shutdown

            shutdown()
    deadline = time.monotonic() + GRACE_S
    if "threads" not in allowed:
        started = [t for t in threading.enumerate()
                   if t not in before.threads and not t.daemon and t is not threading.current_thread()]
        for thread in started:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [t for t in started if t.is_alive()]
        if alive:
            found.append(f"non-daemon threads still alive {GRACE_S:g} s after the test: "
                         f"{', '.join(_thread_text(t) for t in alive)}. HINT: stop and join them in a "
                         "finally (or a fixture's teardown).")
    if "processes" not in allowed:
        new = child_pids() - before.processes - _kept_pids()
        alive_pids = sorted(pid for pid in new if not _wait_process(pid, deadline))
        if alive_pids:
            found.append(f"child processes still alive {GRACE_S:g} s after the test (now killed): "
                         f"{', '.join(f'{pid} ({_command(pid)})' for pid in alive_pids)}. HINT: wait for "
                         "them (or kill and wait) in a finally (or a fixture's teardown).")
            for pid in alive_pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)  # its owner (a Popen, a Process) still reaps it
    return found
