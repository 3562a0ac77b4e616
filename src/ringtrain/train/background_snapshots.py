"""Background snapshots: a save blocks training only for a copy of the state into memory of its own.

**Who owns what.** Each process that saves (a rank) has one writer process
(:mod:`ringtrain.train.snapshot_writer`), started the first time it is needed, in a session of its own,
and kept for the life of the process. A save copies every tensor storage of the state, raw, into the
*arena*, a memfd (shared memory that lives while any process holds it), with the pickle of the
structure around them, and hands the job over with the arena's and the writer lock's file descriptors
(the lock: ``flock`` on ``.snapshot-writer.rank-<r>.lock`` in the snapshot folder, taken by the rank
first). From then on the writer holds the memory and the lock: a SIGKILL of the rank does not stop the
write. The writer serialises the copy (``torch.save``, each storage from the arena to the file once,
hashed on the way), fsyncs it, writes the checksum file and renames: the same
:class:`~ringtrain.train.snapshots.SnapshotManager` calls as a synchronous save, the same bytes.

**One write in flight per rank.** A save first waits for the previous one of its rank (normally long
done) and reuses the arena.

**Parts and the commit.** Where each rank has state of its own (PowerSGD, Local SGD), every rank's
writer writes its part, fsyncs it and leaves its record (size, SHA-256) in the snapshot folder; rank
0's writer writes the snapshot to its temporary name, waits there for every rank's record (up to
``PART_WAIT_S``; a rank's error record or the wait's end abort the snapshot), and commits. The commit
therefore happens as soon as the last part is durable, with no collective on the training thread and
no delay to the next agreement point.

**Errors.** A write that fails is told to its rank; at the rank's next save, and at the end of training
(and before a preemption stop), every rank takes part in one agreement (:mod:`ringtrain.train.agreement`)
and all of them raise, naming the rank, the file and the reason; the snapshots already there are
untouched (a failed write never renames anything).

**A SIGKILL**, at any moment: of a rank before its hand-over, nothing was handed over (the previous
snapshot is the newest); after it, the writer finishes and commits (its lock holds a restart's
clean-up back until then), or, waiting for other ranks' parts when its rank is gone, gives up as soon as
no writer is writing the parts still missing (their locks tell) and leaves no file; of the writer
itself, its temporary file is left, never listed, removed at the next start, and its rank's next save
reports the writer's end.

The Horovod API's own call, :func:`save_snapshot` / :func:`load_snapshot`, uses the same writer.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import logging
import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from ringtrain.exceptions import DamagedSnapshotError, SnapshotError
from ringtrain.train.snapshot_writer import ENV_FAIL, ENV_HOLD, MESSAGE_BYTES, lock_name

log = logging.getLogger(__name__)

#: How long a restarted job waits for the writers of the attempt before it (still writing the last
#: snapshot their ranks handed over) before it cleans the snapshot folder up; past it, a writer on this
#: host is ended (its temporary file is removed as a leftover).
WRITER_WAIT_S = 300.0
#: Storages start at multiples of this in the arena (any tensor's alignment).
_ALIGN = 64
#: Modules whose objects a background snapshot carries; anything else is written synchronously (the
#: writer process might not import it, and its pickle could differ).
_MODULES = frozenset({"builtins", "collections", "torch", "numpy", "datetime", "pathlib"})
_PLAIN = frozenset({int, float, bool, type(None), bytes, complex, dict, list, tuple, set, frozenset})
#: The strings torch's pickler writes itself (a location, its persistent ids' tag), interned: a state
#: holding these very objects shares them with torch's in the file (pickle's memo). A persistent id of the
#: capture names them by their index here; it holds no string of its own (its strings would be pickled
#: through ``persistent_id`` too).
_CONSTANTS = (sys.intern("cpu"), sys.intern("storage"))
_WRITER_MAIN = "import sys; from ringtrain.train.snapshot_writer import main; sys.exit(main())"


@dataclass(frozen=True)
class SnapshotTiming:
    """What one save cost: the training thread's block and the write beside it."""

    step: int | None
    path: str
    mode: str
    """``background`` or ``sync``."""
    blocked_s: float
    """Seconds the saving thread was held (a synchronous save: all of it)."""
    written_s: float | None
    """Seconds the write took, to the commit (None: it failed)."""
    bytes: int
    """Bytes of the file (a snapshot's parts not included)."""
    part_bytes: int = 0
    """Bytes of this rank's part, where it has one."""
    error: str | None = None

    def line(self) -> str:
        """``snapshot 120: blocked 38 ms, written in 2.1 s (112 MB)``."""
        size = self.bytes / 1e6
        amount = (f"{size:.0f} MB" if size >= 10 else f"{size:.1f} MB" if size >= 0.1
                  else f"{self.bytes / 1e3:.0f} kB")
        what = f"snapshot {self.step}" if self.step is not None else f"snapshot {self.path}"
        written = f"{self.written_s:.1f} s" if self.written_s is not None else "-"
        tail = ", synchronous" if self.mode == "sync" else ""
        return f"{what}: blocked {1000 * self.blocked_s:.0f} ms, written in {written} ({amount}{tail})"


class SnapshotHandle:
    """A snapshot being written beside training: :meth:`done`, :meth:`wait`, and what it cost."""

    def __init__(self, path: Path, step: int | None = None, mode: str = "background") -> None:
        self.path = path
        self.step = step
        self.mode = mode
        self.blocked_s = 0.0
        """Seconds the saving thread was held."""
        self.written_s: float | None = None
        """Seconds the write took (None until it is done, or when it failed)."""
        self.bytes = 0
        self.part_bytes = 0
        self.error: str | None = None
        """Why it failed (None: it did not, or is not done)."""
        self.peer: int | None = None
        """A snapshot of several ranks that another rank's failure stopped: that rank."""
        self._errno = 0
        self._failed_at: float | None = None
        self._reported = False
        self._event = threading.Event()
        self._release: Callable[[], None] | None = None

    def done(self) -> bool:
        """True once the write is over (committed, or failed)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Path:
        """Wait for the write; its path once it is committed. Raises :class:`SnapshotError` naming the file
        and the reason when it failed (the snapshots already there are intact), TimeoutError when
        ``timeout`` seconds pass first."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"{self.path} is still being written after {timeout} s")
        failure = self.failure()
        self._reported = True
        if failure is not None:
            raise failure
        return self.path

    def failure(self) -> SnapshotError | None:
        """The failure of a finished write as an exception (None: it was committed, or another rank's
        failure stopped it, which that rank reports)."""
        if self.error is None or self.peer is not None:
            return None
        failure = SnapshotError(self.error)
        if self._errno:
            failure.__cause__ = OSError(self._errno, os.strerror(self._errno))
        if self._failed_at is not None:
            failure.failed_at = self._failed_at  # type: ignore[attr-defined]  # read by the failure report
        return failure

    def timing(self) -> SnapshotTiming:
        return SnapshotTiming(self.step, str(self.path), self.mode, self.blocked_s, self.written_s,
                              self.bytes, self.part_bytes, self.error)

    def _finish(self, result: dict[str, Any]) -> None:
        if result.get("ok"):
            self.written_s = float(result.get("written_s") or 0.0)
        else:
            self.error = str(result.get("error") or "the snapshot writer failed")
            self.peer = result.get("peer")
            self._errno = int(result.get("errno") or 0)
            self._failed_at = result.get("failed_at")
        self.bytes = int(result.get("bytes") or 0)
        self.part_bytes = int(result.get("part_bytes") or 0)
        release, self._release = self._release, None
        if release is not None:
            release()
        self._event.set()


# --- capturing a state: the structure pickled, its storages placed in the arena ----------------------


class _Unsupported(Exception):
    """The state holds something a background snapshot does not carry (it is written synchronously)."""


class _Layout:
    """Where each storage of the states being captured goes in the arena (each once, however many
    tensors view it), in the order pickling meets them."""

    def __init__(self) -> None:
        self.size = 0
        self.storages: list[tuple[Any, int, int]] = []
        self._placed: dict[int, tuple[int, int, int, str | None, Any]] = {}

    def place(self, storage: Any, dtype: Any) -> tuple[Any, ...]:
        key = storage._cdata
        placed = self._placed.get(key)
        if placed is None:
            device = storage.device.type
            if device not in ("cpu", "cuda"):
                raise _Unsupported(f"a storage on the {device} device")
            import torch

            nbytes = int(storage.nbytes())
            offset = -(-self.size // _ALIGN) * _ALIGN
            location = None if device == "cpu" else torch.serialization.location_tag(storage)
            placed = (len(self._placed), offset, nbytes, location, dtype)
            self._placed[key] = placed
            self.storages.append((storage, offset, nbytes))
            self.size = offset + nbytes
        elif placed[4] != dtype and placed[2]:
            raise RuntimeError("Cannot save multiple tensors or storages that view the same data as "
                               "different types")
        index, offset, nbytes, location, _ = placed
        return (0, index, offset, nbytes, location, dtype)


class _Capture(pickle.Pickler):
    """Pickles a state the way torch.save does, but with each storage as its place in the arena."""

    def __init__(self, file: BytesIO, layout: _Layout) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.layout = layout
        self._tensors: dict[int, int] = {}
        """Plain tensors met so far (by ``id``), by their index: one object in the writer too."""
        self._kept: list[Any] = []

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is str:
            # torch's pickler writes these constants itself: a state holding the very same objects shares
            # them in the file (pickle's memo), so the writer must give back the same objects
            for index, constant in enumerate(_CONSTANTS):
                if obj is constant:
                    return (1, index)
            return None
        if kind in _PLAIN:
            return None
        import torch

        if kind is torch.Tensor:
            # the common case, described here rather than through the tensor's own reduce (a few times
            # faster): the writer rebuilds the same tensor, whose reduce then writes the same bytes
            _check_tensor(obj)
            seen = self._tensors.get(id(obj))
            if seen is not None:
                return (3, seen)
            index = self._tensors[id(obj)] = len(self._tensors)
            self._kept.append(obj)  # alive until the end: a tensor made while pickling keeps its id to itself
            dtype = torch.uint8 if obj.dtype in _new_dtypes() else obj.dtype  # as torch.save checks them
            placed = self.layout.place(obj.untyped_storage(), dtype)
            return (2, index, placed, obj.dtype, obj.storage_offset(), tuple(obj.size()), obj.stride(),
                    obj.requires_grad, torch._utils.get_tensor_metadata(obj))
        if isinstance(obj, torch.storage.TypedStorage):
            return self.layout.place(obj._untyped_storage, obj.dtype)
        if isinstance(obj, torch.UntypedStorage):
            return self.layout.place(obj, torch.uint8)
        if isinstance(obj, torch.Tensor):
            _check_tensor(obj)
            return None
        module = (getattr(kind, "__module__", None) or "").partition(".")[0]
        if module not in _MODULES:
            raise _Unsupported(f"an object of {getattr(kind, '__module__', '?')}.{kind.__qualname__}")
        return None


def _new_dtypes() -> Any:
    """The dtypes torch.save pickles with an untyped storage (``_rebuild_tensor_v3``)."""
    import torch

    return torch.storage._new_dtypes()


def _check_tensor(tensor: Any) -> None:
    import torch

    if type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        raise _Unsupported(f"a tensor of type {type(tensor).__qualname__}")
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        raise _Unsupported(f"a {tensor.layout} tensor")
    if tensor.device.type not in ("cpu", "cuda"):
        raise _Unsupported(f"a tensor on the {tensor.device.type} device")
    if getattr(tensor, "__dict__", None):
        raise _Unsupported("a tensor with Python attributes")


@dataclass
class _Captured:
    layout: _Layout
    pickles: list[tuple[int, bytes] | None]
    """Where each captured object's pickle goes in the arena, and the pickle (None: no object)."""

    @property
    def size(self) -> int:
        placed = [offset + len(data) for item in self.pickles if item is not None for offset, data in [item]]
        return max([self.layout.size, *placed])


def _capture(*objects: Any) -> _Captured:
    """Pickle ``objects`` (None: none) with their storages placed, storages first, pickles after them."""
    layout = _Layout()
    buffers: list[bytes | None] = []
    for obj in objects:
        if obj is None:
            buffers.append(None)
            continue
        out = BytesIO()
        _Capture(out, layout).dump(obj)
        buffers.append(out.getvalue())
    pickles: list[tuple[int, bytes] | None] = []
    end = layout.size
    for data in buffers:
        if data is None:
            pickles.append(None)
        else:
            pickles.append((end, data))
            end += len(data)
    return _Captured(layout, pickles)


class _Arena:
    """This process's arena: a memfd mapped here and in the writer, reused by every save (a new, larger one
    when the state outgrows it). It stays resident between saves: a save copies into memory already
    mapped instead of faulting in fresh pages."""

    def __init__(self) -> None:
        self.fd = -1
        self.size = 0
        self._map: mmap.mmap | None = None
        self._bytes: Any = None

    def ensure(self, size: int) -> None:
        if size <= self.size and self._map is not None:
            return
        page = mmap.PAGESIZE
        grown = -(-max(size + size // 8, 1 << 16) // page) * page
        fd = os.memfd_create("ringtrain-snapshot-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, grown)
            new = mmap.mmap(fd, grown)
        except BaseException:
            os.close(fd)
            raise
        self.close()
        import torch

        self.fd, self.size, self._map = fd, grown, new
        self._bytes = torch.frombuffer(new, dtype=torch.uint8)

    def fill(self, captured: _Captured) -> None:
        """Copy the captured storages and pickles in (the rank's only large work of a save)."""
        import torch

        assert self._map is not None
        for storage, offset, nbytes in captured.layout.storages:
            if nbytes:
                source = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (nbytes,),
                                                                                       (1,))
                self._bytes[offset:offset + nbytes].copy_(source)
        for item in captured.pickles:
            if item is not None:
                offset, data = item
                self._map[offset:offset + len(data)] = data

    def close(self) -> None:
        self._bytes = None
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        if self.fd >= 0:
            os.close(self.fd)
        self.fd, self.size = -1, 0


# --- the writer process and the talk with it ---------------------------------------------------------


def _take_lock(folder: Path, rank: int) -> int:
    """This rank's writer lock in ``folder``, locked (it waits for a writer of an earlier attempt of the
    same rank, up to WRITER_WAIT_S); an open file descriptor, handed over with the job."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / lock_name(rank), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + WRITER_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise SnapshotError(
                    f"another snapshot writer of rank {rank} has been writing in {folder} for "
                    f"{WRITER_WAIT_S:.0f} s ({folder / lock_name(rank)}). HINT: end the process named in "
                    "that file, or use another --snapshot-dir.") from None
            time.sleep(0.05)
        except OSError:  # a file system without locks: nothing to wait for
            return fd


class _Writer:
    """This process's snapshot writer: started once, one job at a time, answers read by a thread."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.arena = _Arena()
        self.pending: SnapshotHandle | None = None
        self._pending_id = 0
        self._next_id = 1
        atexit.register(self._at_exit)

    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Start the writer process unless it runs (at once: it imports torch while the rank works on)."""
        with self._lock:
            if self.proc is not None and self.proc.poll() is None and self._sock is not None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                # (-c, not -m: the package imports the module first, and -m would run a second copy)
                proc = subprocess.Popen([sys.executable, "-c", _WRITER_MAIN, str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            self.proc, self._sock = proc, ours
            threading.Thread(target=self._listen, args=(proc, ours), name="ringtrain-snapshot-writer",
                             daemon=True).start()

    def _listen(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            kind, result = pickle.loads(data)
            if kind != "done":
                continue
            with self._lock:
                handle = self.pending if result.get("id") == self._pending_id else None
            if handle is not None:
                handle._finish(result)
        # the writer is gone: a job in hand is lost
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        how = ("still running" if code is None else f"killed by {signal.Signals(-code).name}" if code < 0
               else f"exit code {code}")
        with self._lock:
            if self._sock is sock:
                self._sock = None
            handle = self.pending if self.pending is not None and not self.pending.done() else None
        if handle is not None:
            handle._finish({"ok": False, "failed_at": time.time(), "error": (
                f"the snapshot writer of this rank (pid {proc.pid}) ended ({how}) before {handle.path} was "
                "written. The snapshots already there are intact. HINT: see the writer's messages above; "
                "the next run resumes from the newest complete snapshot.")})
        with contextlib.suppress(OSError):
            sock.close()

    def wait_idle(self, timeout: float | None = None) -> SnapshotHandle | None:
        """Wait for the job in flight (never two in flight); it, done, or None."""
        handle = self.pending
        if handle is not None:
            handle._event.wait(timeout)
        return handle

    def submit(self, spec: dict[str, Any], objects: tuple[Any, ...], lock_folder: Path, rank: int,
               handle: SnapshotHandle) -> SnapshotHandle:
        """Copy ``objects`` (body, part) into the arena and hand the job over; raises _Unsupported before
        anything is handed over when they hold what a background snapshot does not carry."""
        self.wait_idle()
        captured = _capture(*objects)
        self.start()
        arena = self.arena
        arena.ensure(captured.size)
        arena.fill(captured)
        spec = dict(spec)
        for name, item in zip(("body", "part"), captured.pickles):
            spec[name] = None if item is None else (item[0], len(item[1]))
        spec["rank_pid"] = os.getpid()
        spec["hooks"] = _hooks()
        lock = _take_lock(lock_folder, rank)
        with self._lock:
            job_id = self._next_id
            self._next_id += 1
            spec["id"] = job_id
            self.pending, self._pending_id = handle, job_id
            handle._release = lambda: os.close(lock)
            sock = self._sock
        try:
            if sock is None:
                raise OSError(errno.EPIPE, "the snapshot writer is gone")
            socket.send_fds(sock, [pickle.dumps(("job", spec))], [arena.fd, lock])
        except OSError as exc:
            handle._finish({"ok": False, "failed_at": time.time(), "errno": exc.errno,
                            "error": f"cannot hand {handle.path} to the snapshot writer: {exc}"})
        return handle

    def cancel(self) -> None:
        """Tell the writer that nobody waits for the job in hand: it stops waiting for other ranks' parts
        soon (a write itself goes on)."""
        with self._lock:
            sock, handle = self._sock, self.pending
        if sock is None or handle is None or handle.done():
            return
        with contextlib.suppress(OSError):
            sock.send(pickle.dumps(("cancel", None)))

    def _at_exit(self) -> None:
        """The process ends: the job in flight is finished first (the last snapshot is on disk before the
        process exits), then the writer goes with the socket."""
        handle = self.pending
        if handle is not None and not handle.done():
            self.cancel()
            handle._event.wait()
            if handle.error and not handle._reported and handle.peer is None:
                print(f"ringtrain: {handle.error}", file=sys.stderr, flush=True)
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the writer sees the end now (and the listener wakes)
            with contextlib.suppress(OSError):
                sock.close()
        self.arena.close()


_writer: _Writer | None = None
_writer_lock = threading.Lock()


def writer() -> _Writer:
    """This process's snapshot writer (created, not started, on first use)."""
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = _Writer()
        return _writer


def writer_pids() -> list[int]:
    """The pid of this process's writer, while it runs (a helper kept for the process's life)."""
    pid = _writer.pid() if _writer is not None else None
    return [pid] if pid is not None else []


def supported() -> bool:
    """Whether this platform can write in the background (memfd and packet sockets: Linux)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "SOCK_SEQPACKET") and hasattr(socket, "send_fds")


def _hooks() -> dict[str, Any]:
    """The test hooks of the writer, from this process's environment now (see snapshot_writer)."""
    hooks: dict[str, Any] = {"attempt": os.environ.get("RINGTRAIN_ATTEMPT", "0")}
    if os.environ.get(ENV_HOLD):
        hooks["hold"] = os.environ[ENV_HOLD]
    fail = os.environ.get(ENV_FAIL)
    if fail:
        code, what, rank = (fail.split(":") + ["snapshot", "0"])[:3]
        hooks["fail"] = (code, what, int(rank))
    return hooks


def wait_for_writers(folder: str | os.PathLike[str], timeout: float = WRITER_WAIT_S) -> list[str]:
    """Wait until no snapshot writer is writing in ``folder`` (the writers of ranks that died still finish
    the snapshot they were handed); call it before cleaning a folder up or listing it after a restart.
    Returns what to say: a writer that was still at it after ``timeout`` is ended when it runs on this
    host (its temporary file is then a leftover), else left and named."""
    folder = Path(folder)
    notes: list[str] = []
    if not folder.is_dir():
        return notes
    for path in sorted(folder.glob(".snapshot-writer.rank-*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # flock needs no more (a read-only folder too)
        except OSError:
            continue
        try:
            note = _wait_for_lock(fd, path, timeout)
            if note:
                notes.append(note)
        finally:
            os.close(fd)
    return notes


def _wait_for_lock(fd: int, path: Path, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    killed = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            pass
        except OSError:
            return None
        if time.monotonic() > deadline:
            words = os.pread(fd, 200, 0).decode(errors="replace").split()
            pid, host = (int(words[0]) if words and words[0].isdigit() else 0), (words[1:2] or ["?"])[0]
            if killed or not pid or host != socket.gethostname():
                return (f"a snapshot writer (pid {pid} on {host}) is still writing in {path.parent} after "
                        f"{timeout:g} s; going on without it")
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + 10
        time.sleep(0.05)


def _write_here(handle: SnapshotHandle, spec: dict[str, Any], body: Any, part: Any) -> None:
    """A job written by this thread (a state the writer cannot carry, or no writer here): the writer's
    own code, so the same files, part records and errors."""
    from ringtrain.train.snapshot_writer import write_job

    spec = {**spec, "hooks": _hooks(), "rank_pid": os.getpid()}
    handle.mode = "sync"
    handle._finish(write_job(spec, None if body is None else lambda: body,
                             None if part is None else lambda: part))


# --- the Trainer's background saves --------------------------------------------------------------------


class TrainerSnapshots:
    """The Trainer's background snapshots on one rank: hand a save over, and settle the one before.

    ``settle()`` waits for this rank's previous write and returns its failure (None: none), which the
    Trainer agrees on with the other ranks before anything else; the rank-0 log line of each write is
    said then (``snapshot 120: blocked 38 ms, written in 2.1 s (112 MB)``), and :attr:`saves` keeps every
    save's :class:`SnapshotTiming`.
    """

    def __init__(self, manager: Any, rank: int, saves: list[SnapshotTiming],
                 say: Callable[[str], None]) -> None:
        self.manager = manager
        self.rank = rank
        self.say = say
        self.saves = saves
        self._handle: SnapshotHandle | None = None
        self._warned = False
        if _writer is not None:
            # a job of a Trainer that was left without settling (it raised) waits for nobody now
            _writer.cancel()

    def start_writer(self) -> None:
        """Start the writer now (it imports torch meanwhile), not at the first save."""
        writer().start()

    def settle(self) -> SnapshotError | None:
        """Wait for this rank's write in flight; its failure (another rank's failure is that rank's)."""
        handle, self._handle = self._handle, None
        if handle is None:
            return None
        handle._event.wait()
        handle._reported = True
        self.saves.append(handle.timing())
        if self.rank == 0 and handle.error is None:
            self.say(handle.timing().line())
        return handle.failure()

    def submit(self, step: int, body: Any, part: Any, world_size: int, token: int) -> SnapshotHandle:
        """Copy this rank's share of the snapshot of ``step`` (``body`` on rank 0, ``part`` where each rank
        has one) and hand it to the writer (what the writer cannot carry is written here and now). Raises
        nothing a write would not: a failure is the handle's, settled at the next save like the write's."""
        from ringtrain.train.snapshots import snapshot_name

        manager = self.manager
        handle = SnapshotHandle(manager.folder / snapshot_name(step), step)
        self._handle = handle
        if body is None and part is None:
            handle._finish({"ok": True})
            return handle
        spec = {"kind": "snapshot", "folder": os.path.abspath(manager.folder), "keep_last": manager.keep_last,
                "step": step, "rank": self.rank, "world": world_size, "token": token}
        if supported():
            try:
                return writer().submit(spec, (body, part), manager.folder, self.rank, handle)
            except _Unsupported as exc:
                if not self._warned:
                    log.warning("this snapshot holds %s, which only a synchronous save writes: its saves "
                                "block training", exc)
                    self._warned = True
            except Exception as exc:  # nothing was handed over: told at the next save, as a failed write
                error = (str(manager._cannot_write(handle.path, exc)) if isinstance(exc, OSError)
                         else str(exc) if isinstance(exc, SnapshotError)
                         else f"cannot write snapshot {handle.path}: {type(exc).__name__}: {exc}")
                handle._finish({"ok": False, "error": error, "failed_at": time.time(),
                                "errno": getattr(exc, "errno", 0) or 0})
                return handle
            except BaseException:
                self._handle = None
                raise
        _write_here(handle, spec, body, part)
        return handle

    def cancel(self) -> None:
        """The Trainer leaves on an error: the job in flight waits for no other rank any more."""
        if self._handle is not None and _writer is not None:
            _writer.cancel()


# --- the Horovod API's own call ------------------------------------------------------------------------


def save_snapshot(state: Any, path: str | os.PathLike[str]) -> SnapshotHandle:
    """Write ``state`` to ``path`` beside training; returns at once with a :class:`SnapshotHandle`.

    This process blocks only to copy the tensors into memory its writer process holds (and to wait for
    its previous save, if that is still being written); the writer writes ``path`` atomically with its
    checksum file beside it (``.json``), so that ``path`` is either the previous complete file or the new
    one, never a part of one, even if this process is killed meanwhile. ``handle.wait()`` returns the
    path once it is on disk and raises :class:`SnapshotError` (the file and the reason) when the write
    failed; a failure nobody waited for is raised by the next ``save_snapshot``. At exit, the process
    waits for the write in flight. Read it back with :func:`load_snapshot`. Not collective: call it on
    the ranks that write (usually ``if hvd.rank() == 0``).
    """
    final = Path(path)
    started = time.perf_counter()
    handle = SnapshotHandle(final)
    w = writer() if supported() else None
    previous = w.wait_idle() if w is not None else None
    if previous is not None and not previous._reported:
        previous._reported = True
        failure = previous.failure()
        if failure is not None:
            raise failure
    rank = int(os.environ.get("RANK", "0") or 0)
    from ringtrain.train.snapshots import SnapshotManager

    manager = SnapshotManager(final.parent)
    manager.write_hint = "save to a writable folder."
    spec = {"kind": "file", "path": os.path.abspath(final), "rank": rank, "hint": manager.write_hint}
    if w is not None:
        try:
            w.submit(spec, (state, None), final.parent, rank, handle)
            handle.blocked_s = time.perf_counter() - started
            return handle
        except _Unsupported as exc:
            log.warning("%s holds %s: written synchronously", final, exc)
        except OSError as exc:
            raise manager._cannot_write(final, exc) from exc
    _write_here(handle, spec, state, None)
    handle.blocked_s = time.perf_counter() - started
    failure = handle.failure()
    handle._reported = True
    if failure is not None:
        raise failure
    return handle


def load_snapshot(path: str | os.PathLike[str]) -> Any:
    """What :func:`save_snapshot` wrote to ``path``, its size and SHA-256 checked against its checksum
    file first (:class:`~ringtrain.exceptions.DamagedSnapshotError` when they do not match).

    ``path`` may be a folder: the newest file there (by time written) with a checksum file that verifies
    is loaded, damaged ones skipped with a warning; None when the folder holds none (or does not exist;
    a missing ``.pt`` file is an error). A Trainer's
    snapshot folder works too. A write of this process to it in flight is waited for first, and so are
    the writers of ranks of an earlier attempt still writing there. Loading uses
    ``torch.load(weights_only=True)``: tensors, numbers, strings and containers of them.
    """
    from ringtrain.train.snapshots import CHECKSUM_FORMAT, SnapshotManager, checksum_path

    target = Path(path)
    if _writer is not None:
        _writer.wait_idle()
    if not target.exists() and target.suffix != ".pt":
        return None  # a folder that was never written to: nothing to resume
    folder = target if target.is_dir() else target.parent
    for note in wait_for_writers(folder):
        log.warning(note)
    manager = SnapshotManager(folder)
    if not target.is_dir():
        if not manager.verify(target):
            log.warning("%s has no checksum file: loading it unverified", target)
        return manager._read(target)
    candidates = []
    for file in target.glob("*.pt"):
        if file.name.startswith("."):
            continue
        with contextlib.suppress(OSError, ValueError):
            record = _json_of(checksum_path(file))
            if record.get("format") == CHECKSUM_FORMAT and record.get("file") == file.name:
                candidates.append((file.stat().st_mtime_ns, file))
    for _, file in sorted(candidates, reverse=True):
        try:
            manager.verify(file)
            return manager._read(file)
        except DamagedSnapshotError as exc:
            log.warning("%s: skipped", str(exc).split(" HINT:", 1)[0])
    return None


def _json_of(path: Path) -> dict[str, Any]:
    import json

    body = json.loads(path.read_text())
    return body if isinstance(body, dict) else {}


__all__ = ["SnapshotHandle", "SnapshotTiming", "TrainerSnapshots", "load_snapshot", "save_snapshot",
           "wait_for_writers", "writer_pids"]
