"""The snapshot writer: a process per rank that writes, beside training, the snapshots its rank hands it.

A rank starts one (running :func:`main` with a socket's descriptor, in a session of its own: a SIGKILL
of the rank, or of the rank's process group by torch's agent, does not reach it) and talks to it over a
Unix socket pair of packets (:mod:`ringtrain.train.background_snapshots` is the rank's side). A job
arrives as one small message with two file descriptors:

* the **arena**, a memfd that holds the rank's copy of its state: every tensor storage, raw, and the
  pickle of the structure around them (tensors refer to their storage by its place in the arena). The
  writer maps it as it reads the job, so the copy lives as long as either process holds it: a rank
  that dies after handing a job over leaves it to be written all the same;
* the rank's **writer lock**, ``.snapshot-writer.rank-<r>.lock`` in the snapshot folder, locked with
  ``flock`` by the rank before it hands the job over. A lock belongs to the open file, which both
  processes hold, so it is held from the hand-over until the job is done even if the rank dies: a
  restarted job waits on it (:func:`ringtrain.train.background_snapshots.wait_for_writers`) before it
  cleans the folder up and lists its snapshots.

The writer rebuilds the tensors over the arena, exactly as ``torch.load`` rebuilds them from a file,
and hands them to :class:`~ringtrain.train.snapshots.SnapshotManager`: ``torch.save`` (the tensors'
bytes go from the arena to the file once, hashed on the way), fsync, checksum file, rename, prune. A
snapshot written here is byte for byte the one a synchronous save writes. A rank's *part* (state that
differs between ranks) is written with ``save_part``; its record (name, size, SHA-256) is then left in
the folder as ``.snapshot-<step>.rank-<r>.<token>.record.tmp``, and rank 0's writer commits the
snapshot once it holds every rank's record (or aborts it on a rank's error record, or after
:data:`PART_WAIT_S`). The answer goes back as one message; a writer whose rank is gone (the socket
reached its end) finishes the job in hand, says on stderr what went wrong if anything did, and exits.

Two hooks exist for tests (read by the rank from its environment at each save, carried in the job):
``RINGTRAIN_SNAPSHOT_TEST_HOLD=DIR`` makes the writer stop just before each rename that commits a file,
say so in ``DIR/held.<attempt>.<rank>.<step>.<what>.json`` and wait for ``DIR/release.<attempt>``;
``RINGTRAIN_SNAPSHOT_TEST_FAIL=ERRNO:WHAT:RANK`` (``ENOSPC:snapshot:0``, ``EIO:part:1``) makes that
write fail with that error.
"""

from __future__ import annotations

import errno
import gc
import json
import mmap
import os
import pickle
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: The most bytes of one message on the socket (jobs and answers are small: the state is in the arena).
MESSAGE_BYTES = 1 << 16
#: How long rank 0's writer waits for the other ranks' part records before it gives the snapshot up.
PART_WAIT_S = 600.0
#: How long a writer whose rank is gone (or leaving) still waits for the other ranks' parts where their
#: writers' locks cannot tell whether those are still being written (a file system without locks).
ORPHAN_GRACE_S = 10.0
#: How the writer shares the CPU with training (``RINGTRAIN_SNAPSHOT_WRITER_SCHED``): ``idle`` (the
#: default: Linux's SCHED_IDLE, it runs only on cores training leaves idle; when training keeps every
#: core busy, the next save waits for the write and so hands it a core), ``nice`` (niceness 10) or
#: ``normal``.
ENV_SCHED = "RINGTRAIN_SNAPSHOT_WRITER_SCHED"
NICE = 10
#: The environment variables of the test hooks (see the module doc).
ENV_HOLD = "RINGTRAIN_SNAPSHOT_TEST_HOLD"
ENV_FAIL = "RINGTRAIN_SNAPSHOT_TEST_FAIL"
_HOLD_LIMIT_S = 600.0
_POLL_S = 0.02
#: Strings that torch's pickler writes itself, by their index in the rank's persistent ids (the same
#: tuple as :data:`ringtrain.train.background_snapshots._CONSTANTS`).
_CONSTANTS = (sys.intern("cpu"), sys.intern("storage"))


def lock_name(rank: int) -> str:
    """The writer lock of rank ``rank`` in a snapshot folder."""
    return f".snapshot-writer.rank-{rank:05d}.lock"


def record_name(step: int, rank: int, token: int) -> str:
    """Where rank ``rank``'s writer leaves the record of its part of the snapshot of ``step`` (a temporary
    file by its name: removed with the leftovers at the next start)."""
    return f".snapshot-{step:09d}.rank-{rank:05d}.{token:x}.record.tmp"


def _say(text: str) -> None:
    """A line on stderr, which may be gone with the rank."""
    try:
        print(f"ringtrain snapshot writer (pid {os.getpid()}): {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class _Arena:
    """The rank's arena, mapped once per memfd (a new one arrives when the state outgrows the old)."""

    def __init__(self) -> None:
        self.identity: tuple[int, int] | None = None
        self.map: mmap.mmap | None = None

    def take(self, fd: int) -> mmap.mmap:
        info = os.fstat(fd)
        identity = (info.st_dev, info.st_ino)
        if identity != self.identity or self.map is None or len(self.map) != info.st_size:
            self.release()
            self.map = mmap.mmap(fd, info.st_size)
            self.identity = identity
        return self.map

    def release(self) -> None:
        if self.map is not None:
            gc.collect()  # tensors over the old map must be gone before it is unmapped
            try:
                self.map.close()
            except BufferError:  # something still looks at it: leave it mapped, it goes with the process
                pass
        self.map, self.identity = None, None


class _Rebuild(pickle.Unpickler):
    """Unpickles a structure captured by the rank, its storages taken from the arena (as torch.load takes
    them from a file: one storage per key, shared by every tensor that views it)."""

    def __init__(self, data: memoryview, arena: mmap.mmap, origins: dict[int, str]) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self._arena = arena
        self._storages: dict[int, Any] = {}
        self._tensors: dict[int, Any] = {}
        self._origins = origins

    def persistent_load(self, pid: Any) -> Any:
        import torch

        kind = pid[0]
        if kind == 1:
            return _CONSTANTS[pid[1]]  # torch's own string, as the rank's structure held it
        if kind == 3:
            return self._tensors[pid[1]]  # a tensor met before: the same object
        if kind == 2:  # a plain tensor: rebuilt as torch.load's _rebuild_tensor_v2/_v3 rebuild one
            _, index, placed, dtype, offset, size, stride, requires_grad, metadata = pid
            tensor = torch.empty((0,), dtype=dtype).set_(self._storage(placed), offset, size, stride)
            if requires_grad:
                tensor.requires_grad = True
            if metadata:
                torch._utils.set_tensor_metadata(tensor, metadata)
            self._tensors[index] = tensor
            return tensor
        return torch.storage.TypedStorage(wrap_storage=self._storage(pid), dtype=pid[5], _internal=True)

    def _storage(self, placed: Any) -> Any:
        """The storage a persistent id of the rank places in the arena (one object per storage)."""
        import torch

        _, index, offset, nbytes, location, _ = placed
        storage = self._storages.get(index)
        if storage is None:
            if nbytes:
                storage = torch.frombuffer(self._arena, dtype=torch.uint8, count=nbytes,
                                           offset=offset).untyped_storage()
            else:
                storage = torch.UntypedStorage(0)
            if location is not None:
                self._origins[storage._cdata] = location
            self._storages[index] = storage
        return storage


_origins: dict[int, str] = {}
"""The device each storage of the job in hand came from, where not the CPU (by storage)."""


def _location_tag(storage: Any) -> str | None:
    """Where a storage of the arena came from (``cuda:0``), so that the file says what a synchronous save
    of the rank's tensors says; None for the CPU's (torch's own tagger names them)."""
    location = _origins.get(storage._cdata) if _origins else None
    if location is None:
        return None
    kind, _, index = location.partition(":")
    return kind + ":" + index  # a new string each time, as torch's own taggers make them


def _install_tagger() -> None:
    import torch

    torch.serialization.register_package(-1_000_003, _location_tag, lambda obj, location: None)


def _writer_manager(folder: Path, keep_last: int, job: Mapping[str, Any], what: str) -> Any:
    """A :class:`SnapshotManager` for ``folder`` with the job's test hooks on its write and rename."""
    from ringtrain.train.snapshots import SnapshotManager

    hooks = job.get("hooks") or {}
    rank, step = int(job["rank"]), int(job.get("step") or 0)

    class WriterManager(SnapshotManager):
        def _write_temp(self, body: Any, final: Path) -> Path:
            fail = hooks.get("fail")
            if fail and fail[1] == what and int(fail[2]) == rank:
                code = getattr(errno, fail[0])
                raise OSError(code, os.strerror(code), str(final))
            return super()._write_temp(body, final)

        def _commit(self, temp: Path, final: Path) -> None:
            if hooks.get("hold"):
                _hold(Path(hooks["hold"]), str(hooks.get("attempt", "0")), rank, step, what, job)
            super()._commit(temp, final)

    manager = WriterManager(folder, keep_last)
    if job.get("hint"):
        manager.write_hint = str(job["hint"])
    return manager


def _hold(folder: Path, attempt: str, rank: int, step: int, what: str, job: Mapping[str, Any]) -> None:
    """The test hook: say where the writer stands, then wait for the test's release file."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f"held.{attempt}.{rank}.{step}.{what}.json"
    staging = marker.with_name(marker.name + ".tmp")
    staging.write_text(json.dumps({"writer_pid": os.getpid(), "rank_pid": job.get("rank_pid"), "rank": rank,
                                   "step": step, "what": what, "attempt": attempt}))
    os.replace(staging, marker)
    release = folder / f"release.{attempt}"
    deadline = time.monotonic() + _HOLD_LIMIT_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(_POLL_S)


class _PeerFailed(Exception):
    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


class _Job:
    """One job in hand: whether its rank is still there to wait for (no socket: the rank writes itself)."""

    def __init__(self, job_id: int, sock: socket.socket | None) -> None:
        self.job_id = job_id
        self.sock = sock
        self.leaving = False
        """The rank is gone (the socket ended) or leaving (it said cancel): wait for nobody for long."""

    def poll_rank(self) -> None:
        """Read what the rank says meanwhile (only ``cancel`` can come), or notice that it is gone."""
        while not self.leaving and self.sock is not None:
            try:
                readable, _, _ = select.select([self.sock], [], [], 0)
                if not readable:
                    return
                data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_BYTES, 4)
            except OSError:
                self.leaving = True
                return
            for fd in fds:
                os.close(fd)
            if not data:
                self.leaving = True
                return
            kind, body = pickle.loads(data)
            if kind == "cancel" and body in (None, self.job_id):
                self.leaving = True


def _write_record(folder: Path, step: int, rank: int, token: int, record: Mapping[str, Any]) -> None:
    target = folder / record_name(step, rank, token)
    staging = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    with open(staging, "w") as fp:
        json.dump(dict(record), fp)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(staging, target)


def _wait_for_records(folder: Path, job_spec: Mapping[str, Any], job: _Job,
                      own: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0's writer: every rank's part record (rank 0's is ``own``), in rank order; raises
    :class:`_PeerFailed` on a rank's error record, SnapshotError when they do not all come in time."""
    from ringtrain.exceptions import SnapshotError
    from ringtrain.train.snapshots import part_name, snapshot_name

    spec = job_spec
    step, world, token = int(spec["step"]), int(spec["world"]), int(spec["token"])
    found: dict[int, dict[str, Any]] = {0: own}
    start = time.monotonic()
    deadline = start + float(spec.get("part_wait_s") or PART_WAIT_S)
    gone: list[int] = []

    def look() -> None:
        for rank in range(1, world):
            if rank in found:
                continue
            try:
                record = json.loads((folder / record_name(step, rank, token)).read_text())
            except (OSError, ValueError):
                continue
            if record.get("error"):
                raise _PeerFailed(rank, str(record["error"]))
            found[rank] = {"file": record["file"], "bytes": int(record["bytes"]), "sha256": record["sha256"]}

    while True:
        look()
        if len(found) == world:
            return [found[rank] for rank in range(world)]
        job.poll_rank()
        if job.leaving:
            # Nobody waits for this snapshot any more: go on waiting only for parts still being written,
            # which their writers' locks tell (a writer leaves its record before it lets its lock go).
            states = {rank: _writer_idle(folder, rank) for rank in range(1, world) if rank not in found}
            idle = [rank for rank, state in states.items() if state]
            if None in states.values():
                deadline = min(deadline, start + ORPHAN_GRACE_S, time.monotonic() + ORPHAN_GRACE_S)
            elif idle:
                look()
                gone = [rank for rank in idle if rank not in found]
                if gone:
                    deadline = time.monotonic()
        if time.monotonic() >= deadline:
            missing = [part_name(step, rank) for rank in range(world) if rank not in found]
            why = ("no writer is writing them" if gone else "this rank is leaving" if job.leaving
                   else f"they did not come within {deadline - start:.0f} s")
            raise SnapshotError(
                f"snapshot {folder / snapshot_name(step)} was not committed: the parts "
                f"{', '.join(missing)} of other ranks are missing ({why}). The snapshots already there are "
                "intact. HINT: see those ranks' errors; the snapshot folder must be one that every rank "
                "shares.")
        time.sleep(_POLL_S)


def _writer_idle(folder: Path, rank: int) -> bool | None:
    """Whether no writer of rank ``rank`` holds its lock in ``folder`` now (None: locks do not work there)."""
    import fcntl

    try:
        fd = os.open(folder / lock_name(rank), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return None
    finally:
        os.close(fd)


def run_job(spec: Mapping[str, Any], arena: mmap.mmap, sock: socket.socket) -> dict[str, Any]:
    """Write one job handed over by the rank, its objects rebuilt from the arena."""
    body, part = spec.get("body"), spec.get("part")
    return write_job(spec, None if body is None else lambda: _rebuilt(arena, body),
                     None if part is None else lambda: _rebuilt(arena, part), _Job(int(spec["id"]), sock))


def write_job(spec: Mapping[str, Any], body: Callable[[], Any] | None, part: Callable[[], Any] | None,
              job: _Job | None = None) -> dict[str, Any]:
    """Write a job's ``body`` (a snapshot, or a file) and ``part`` (this rank's part of a snapshot), each
    given as a function that makes it; the answer for the rank (a write that fails is the answer, not an
    exception). The rank runs it itself for a state the writer cannot carry."""
    from ringtrain.exceptions import SnapshotError

    started = time.monotonic()
    job = job or _Job(int(spec.get("id") or 0), None)
    result: dict[str, Any] = {"id": spec.get("id"), "ok": True, "error": None, "errno": 0, "peer": None,
                              "bytes": 0, "part_bytes": 0, "written_s": 0.0, "failed_at": None}
    try:
        if spec["kind"] == "file":
            assert body is not None
            final = Path(spec["path"])
            manager = _writer_manager(final.parent, 1, spec, "file")
            written = manager.write(body(), final)
            manager.commit(written, prune=False)
            result["bytes"] = written.bytes
        else:
            _write_snapshot(spec, body, part, job, result)
    except _PeerFailed as exc:
        result.update(ok=False, peer=exc.rank, error=str(exc))
    except SnapshotError as exc:
        result.update(ok=False, error=str(exc), errno=_errno_of(exc), failed_at=time.time())
    except Exception as exc:  # the rank must hear of anything that went wrong, with the file
        where = spec.get("path") or spec.get("folder")
        result.update(ok=False, errno=_errno_of(exc), failed_at=time.time(),
                      error=f"the snapshot writer failed writing to {where}: {type(exc).__name__}: {exc}")
    finally:
        _origins.clear()
    result["written_s"] = time.monotonic() - started
    result["leaving"] = job.leaving
    return result


def _write_snapshot(spec: Mapping[str, Any], body: Callable[[], Any] | None, part: Callable[[], Any] | None,
                    job: _Job, result: dict[str, Any]) -> None:
    folder, step, rank = Path(spec["folder"]), int(spec["step"]), int(spec["rank"])
    keep_last, token = int(spec["keep_last"]), int(spec.get("token") or 0)
    own: dict[str, Any] | None = None
    if part is not None:
        try:
            own = _writer_manager(folder, keep_last, spec, "part").save_part(part(), step, rank)
        except Exception as exc:  # rank 0's writer must not wait for this part
            if rank:
                _write_record(folder, step, rank, token, {"error": str(exc)})
            raise
        result["part_bytes"] = own["bytes"]
        if rank:
            _write_record(folder, step, rank, token, own)
    if body is None:
        return
    world = int(spec["world"])
    manager = _writer_manager(folder, keep_last, spec, "snapshot")
    written = manager.write_snapshot(body(), step, parts=world if own is not None else 0)
    records = None
    try:
        if own is not None:
            records = _wait_for_records(folder, spec, job, own)
        manager.commit(written, records)
    except BaseException:
        manager.discard(written)
        raise
    finally:
        if own is not None:
            for other in range(1, world):
                (folder / record_name(step, other, token)).unlink(missing_ok=True)
    result["bytes"] = written.bytes


def _rebuilt(arena: mmap.mmap, where: tuple[int, int]) -> Any:
    offset, length = where
    view = memoryview(arena)[offset:offset + length]
    try:
        return _Rebuild(view, arena, _origins).load()
    finally:
        view.release()


def _errno_of(exc: BaseException | None) -> int:
    for _ in range(8):
        if exc is None:
            break
        if isinstance(exc, OSError) and exc.errno:
            return int(exc.errno)
        exc = exc.__cause__ or exc.__context__
    return 0


def serve(sock: socket.socket) -> None:
    """Take jobs until the rank closes the socket (or dies, which closes it), one at a time."""
    arena = _Arena()
    tagger = False
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 4)
        except OSError:
            break
        if not data:
            for fd in fds:
                os.close(fd)
            break
        kind, spec = pickle.loads(data)
        if kind != "job":
            for fd in fds:
                os.close(fd)
            continue
        arena_fd, lock_fd = fds[0], fds[1]
        try:
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        except OSError:
            pass
        try:
            if not tagger:
                _install_tagger()
                tagger = True
            result = run_job(spec, arena.take(arena_fd), sock)
        finally:
            os.close(arena_fd)
            os.close(lock_fd)  # the lock goes once the rank's copy of it goes too
        try:
            sock.send(pickle.dumps(("done", result)))
        except OSError:  # the rank is gone: nobody else will tell what went wrong
            if not result["ok"] and result["peer"] is None:
                _say(f"rank {spec.get('rank')} ended before its snapshot was written: {result['error']}")
    arena.release()


def _lower_priority(how: str) -> None:
    """Leave the CPU to training (before anything else: torch's import too goes into idle time)."""
    if how == "normal":
        return
    if how == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return
        except OSError:
            pass
    try:
        os.nice(NICE)
    except OSError:
        pass


#: Signals the writer ignores: a scheduler sends them to every process of a job (Slurm's
#: ``--signal=USR1@60`` warning, a cancel's SIGTERM; its own session keeps it out of the terminal's
#: Ctrl-C, not out of those). The rank decides what they mean, and a rank that stops on one hands its
#: last snapshot to this process: it ends once that is written and the rank's socket closes.
IGNORED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


def _ignore_stop_signals() -> None:
    for name in IGNORED_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            signal.signal(number, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    _ignore_stop_signals()
    sock = socket.socket(fileno=int(args[0]))
    _lower_priority(os.environ.get(ENV_SCHED, "idle"))
    import torch

    torch.set_num_threads(1)
    serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
