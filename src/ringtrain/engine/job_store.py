"""The job store: one job's key-value store, open only to processes that hold the job's secret.

Ranks meet here: they publish where they listen (gloo, the control plane, NCCL's id) and read where
the others do. torch's ``TCPStore`` would do the job, but it listens on every interface and answers
anybody: whoever reaches its port can read and rewrite those addresses. This store answers only
connections that have proven the per-job secret (:mod:`ringtrain.engine.auth`), and it proves the
secret back, so a rank never trusts an impostor's store either.

API::

    from ringtrain.engine import job_store

    secret = job_store.new_secret()                    # the launcher, once per job
    server = job_store.JobStoreServer(secret, host="127.0.0.1")   # port 0: a free one
    server.address                                    # "127.0.0.1:41234", for the workers
    store = job_store.JobStore(server.address, secret, timeout=300.0)  # a torch.distributed.Store
    store.set("key", "value"); store.get("key")       # b"value" (get waits for the key)
    server.close()

    job_store.secret_from_environ(environ)             # RINGTRAIN_JOB_SECRET of a mapping, or None
    job_store.address_from_environ(environ)            # RINGTRAIN_JOB_STORE of a mapping, or None

``JobStore`` implements ``set``, ``get`` (blocking, up to the store's timeout), ``add``,
``compare_set``, ``wait`` (with or without a timeout), ``check``, ``delete_key``, ``num_keys``,
``multi_get``, ``multi_set``, ``append`` and ``clone``, with torch's semantics: a timeout raises
``torch.distributed.DistStoreError``; ``add`` counts in a decimal string; ``compare_set`` sets only
when the current value equals ``expected`` (a missing key counts as ``b""``) and returns the value
the key holds afterwards. ``PrefixStore`` and ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` run on
it. **Keep a Python reference to a JobStore for as long as any C++ object (a PrefixStore, a process
group) uses it**: C++ holds the Python object without keeping it alive, and once only C++ holds it,
every call fails with ``fn INTERNAL ASSERT FAILED ... Not implemented``.

Connections: each one starts with the mutual challenge-response of :mod:`ringtrain.engine.auth`
before the server reads a single request byte. After it, every message in either direction carries
an HMAC tag under a key of that connection alone, with a sequence number: a relay that forwards
the handshake cannot change, drop, replay or reorder what follows without the other end closing
the connection. (Traffic is not encrypted: the store holds addresses, not secrets.) Handshakes run
concurrently, each within ``handshake_timeout`` seconds, at most ``max_handshakes`` at once (the
oldest gives way to a new one once it has had ``handshake_grace`` seconds; until then the new one is
refused at once), so idle or slow connections cannot hold up the ranks, nor can a flood of new ones. Whatever
fails the handshake or breaks the protocol is closed and logged in one line (logger
``ringtrain.security``; the first refusal from each source address), and the job goes on.

The server runs its own thread (an asyncio loop), so it works in a launcher that blocks elsewhere
and in rank 0 of a job started without ringtrain's launcher. Bind it to the interface the job uses
(127.0.0.1 when every rank runs on this host), not to every address.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence

import torch.distributed as dist

from ringtrain.engine import auth
from ringtrain.engine.auth import ENV_ADDRESS, ENV_SECRET, new_secret, secret_from_environ
from ringtrain.engine.netutil import open_listener, recv_exact
from ringtrain.engine.store_address import address_from_environ, join_address, split_address
from ringtrain.exceptions import AuthenticationError, JobStoreError

__all__ = [
    "ENV_ADDRESS",
    "ENV_SECRET",
    "JobStore",
    "JobStoreServer",
    "address_from_environ",
    "join_address",
    "new_secret",
    "secret_from_environ",
    "split_address",
]

#: Largest message either side accepts (bytes); stores hold addresses and ids, not tensors.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: Seconds a connection gets to prove itself before it is closed.
HANDSHAKE_TIMEOUT = 10.0
#: Handshakes in progress at once; a new connection beyond this closes the oldest unproven one (once that
#: one is older than HANDSHAKE_GRACE; until then the newcomer is refused).
MAX_HANDSHAKES = 128
#: Seconds a handshake in progress is safe from newer connections: while every slot holds a younger
#: one, a newcomer is refused at once; after it, the oldest gives way (a rank's takes a round trip).
HANDSHAKE_GRACE = 1.0

log = logging.getLogger("ringtrain.security")

_PURPOSE = "job store v1"
_MAGIC = b"RTJSTOR1"
_LENGTH = struct.Struct("<I")
_TAG_BYTES = 32
_ACCEPTED, _REFUSED = b"\x01", b"\x00"

# Requests: one opcode byte, then a list of byte strings. Replies: one status byte, then a list.
_SET, _GET, _ADD, _CAS, _WAIT, _CHECK, _DELETE, _NUM_KEYS, _MULTI_GET, _MULTI_SET, _APPEND, _PING = range(12)
_OK, _TIMEOUT, _ERROR = 0, 1, 2


# ----------------------------------------------------------------------------------- wire format
def _pack_items(items: Sequence[bytes]) -> bytes:
    parts = [_LENGTH.pack(len(items))]
    for item in items:
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def _unpack_items(body: bytes, offset: int) -> list[bytes]:
    """The list of byte strings at ``body[offset:]``; ValueError on anything malformed."""
    (count,) = _LENGTH.unpack_from(body, offset)
    offset += _LENGTH.size
    items = []
    for _ in range(count):
        (size,) = _LENGTH.unpack_from(body, offset)
        offset += _LENGTH.size
        if offset + size > len(body):
            raise ValueError("item runs past the end of the message")
        items.append(body[offset:offset + size])
        offset += size
    if offset != len(body):
        raise ValueError("trailing bytes after the last item")
    return items


class _Tagger:
    """The per-connection HMAC tags: one sequence number per direction."""

    def __init__(self, key: bytes, send_label: bytes, receive_label: bytes) -> None:
        self._key = key
        self._send_label, self._receive_label = send_label, receive_label
        self._sent = 0
        self._received = 0

    def _tag(self, label: bytes, number: int, body: bytes) -> bytes:
        return hmac.new(self._key, label + struct.pack("<Q", number) + body, hashlib.sha256).digest()

    def seal(self, body: bytes) -> bytes:
        tag = self._tag(self._send_label, self._sent, body)
        self._sent += 1
        return _LENGTH.pack(len(body)) + body + tag

    def open(self, body: bytes, tag: bytes) -> bytes:
        if not auth.same(tag, self._tag(self._receive_label, self._received, body)):
            raise ValueError("a message failed its integrity check (changed or replayed in transit)")
        self._received += 1
        return body


# ----------------------------------------------------------------------------------------- server
class _Refused(Exception):
    """A connection that is not one of the job's: closed and logged (``verdict``: sent first)."""

    def __init__(self, reason: str, verdict: bytes = b"") -> None:
        super().__init__(reason)
        self.verdict = verdict



def _quiet_about_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The shutting-down loop's exception handler: a cancelled task is no error, the rest is reported."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)

class JobStoreServer:
    """The job store's server, in a thread of its own; ``address`` is what clients connect to.

    ``secret`` None serves an unauthenticated job (any client that speaks the protocol gets in).
    Raises OSError naming the address when it cannot listen there.
    """

    def __init__(self, secret: str | None, host: str = "127.0.0.1", port: int = 0, *,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT, max_handshakes: int = MAX_HANDSHAKES,
                 handshake_grace: float = HANDSHAKE_GRACE) -> None:
        self._key = auth.derive_key(secret, _PURPOSE)
        self.handshake_timeout = handshake_timeout
        self.handshake_grace = handshake_grace
        self.max_handshakes = max(1, max_handshakes)
        try:
            listener = open_listener(host, port, backlog=1024)
        except OSError as exc:
            raise OSError(exc.errno, f"the job store cannot listen on {join_address(host, port)}: "
                                     f"{exc.strerror}") from None
        self.host = host
        self.port: int = listener.getsockname()[1]
        #: Connections refused so far (wrong secret, not a ringtrain client, garbage, too slow).
        self.refused = 0
        self._logged_sources: set[str] = set()
        self._data: dict[str, bytes] = {}
        self._pending: dict[int, asyncio.StreamWriter] = {}  # handshakes in progress, oldest first
        self._pending_since: dict[int, float] = {}
        self._clients: set[asyncio.StreamWriter] = set()
        self._next_id = 0
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._changed: asyncio.Condition | None = None
        self._server: asyncio.AbstractServer | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listener, ready), name="ringtrain-job-store",
                                        daemon=True)
        self._thread.start()
        ready.wait()

    @property
    def address(self) -> str:
        """``host:port`` of this store."""
        return join_address(self.host, self.port)

    def close(self) -> None:
        """Stop serving: every connection is closed, clients blocked in a wait see an error."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):  # the loop is already gone
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)

    def __enter__(self) -> JobStoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop's thread ----------------------------------------------------------------------
    def _run(self, listener: socket.socket, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._changed = asyncio.Condition()
            self._server = await asyncio.start_server(self._serve, sock=listener, backlog=1024,
                                                      limit=MAX_MESSAGE_BYTES + 64)

        try:
            self._loop.run_until_complete(start())
        finally:
            ready.set()
        try:
            self._loop.run_forever()
        finally:
            if self._server is not None:
                self._server.close()
            for writer in [*self._pending.values(), *self._clients]:
                writer.transport.abort()
            # A connection task cancelled before it first ran ends cancelled, and Python 3.11's stream
            # callback then logs "Exception in callback ... CancelledError" for each: at shutdown that
            # is no error (a flood left up to a thousand of them).
            self._loop.set_exception_handler(_quiet_about_cancelled)
            # Connections accepted in the listener's last batch (up to a thousand under a flood) start
            # their tasks while the first ones are cancelled: cancel until none is left, or closing the
            # loop prints "Task was destroyed but it is pending!" with a traceback for each.
            for _ in range(10):
                tasks = asyncio.all_tasks(self._loop)
                if not tasks:
                    break
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            # Only close() cancels: end quietly (a cancelled connection task makes asyncio print a
            # traceback of its own).
            writer.transport.abort()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        source = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ident = self._next_id
        self._next_id += 1
        if len(self._pending) >= self.max_handshakes:
            oldest = next(iter(self._pending))
            if time.monotonic() - self._pending_since[oldest] < self.handshake_grace:
                # Every slot holds a handshake younger than its grace: this newcomer is refused at once
                # (a rank retries every 0.1 s). Pushing out the oldest instead let a flood, accepted up
                # to a thousand at a time, push out a rank's handshake before it could answer, again
                # and again (measured: no rank connection in 15 s under a loopback flood).
                self._refuse(source, f"came while {self.max_handshakes} younger handshakes were in "
                                     "progress", writer)
                return
            self._pending.pop(oldest).transport.abort()  # its _serve logs the refusal
        self._pending[ident] = writer
        self._pending_since[ident] = time.monotonic()
        try:
            tagger = await asyncio.wait_for(self._handshake(reader, writer, ident), self.handshake_timeout)
        except TimeoutError:
            self._refuse(source, f"sent no valid proof within {self.handshake_timeout:g} s", writer)
            return
        except _Refused as exc:
            self._refuse(source, str(exc), writer, exc.verdict)
            return
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            if ident in self._pending:
                self._refuse(source, "closed the connection before proving the job's secret", writer)
            else:
                self._refuse(source, f"gave way to newer connections ({self.max_handshakes} handshakes "
                                     "were in progress)", writer)
            return
        finally:
            self._pending.pop(ident, None)
            self._pending_since.pop(ident, None)
        self._clients.add(writer)
        try:
            await self._requests(reader, writer, tagger)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the client went away: a rank that finished or died
        except ValueError as exc:
            self._refuse(source, f"broke the protocol after its handshake: {exc}", writer)
        finally:
            self._clients.discard(writer)
            writer.transport.abort()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         ident: int) -> _Tagger:
        server_nonce = auth.new_nonce()
        writer.write(_MAGIC + server_nonce)
        await writer.drain()
        if await reader.readexactly(len(_MAGIC)) != _MAGIC:
            raise _Refused("is not a ringtrain job store client (wrong greeting)")
        hello = await reader.readexactly(auth.NONCE_BYTES + auth.PROOF_BYTES)
        client_nonce, claimed = hello[:auth.NONCE_BYTES], hello[auth.NONCE_BYTES:]
        if not auth.same(claimed, auth.proof(self._key, b"client", server_nonce, client_nonce)):
            # A client of another job (or an unauthenticated one) learns why, and says so clearly.
            raise _Refused("did not prove the job's secret", verdict=_REFUSED)
        # Proven: no longer an unauthenticated handshake that a flood of newer ones may push out (it
        # was, while its acceptance was on the way, and the rank then found its connection closed).
        self._pending.pop(ident, None)
        writer.write(_ACCEPTED + auth.proof(self._key, b"server", server_nonce, client_nonce))
        await writer.drain()
        return _Tagger(auth.session_key(self._key, server_nonce, client_nonce), b"s", b"c")

    def _refuse(self, source: str, reason: str, writer: asyncio.StreamWriter, verdict: bytes = b"") -> None:
        self.refused += 1
        if verdict:
            writer.write(verdict)
            writer.close()  # sends the verdict, then closes
        else:
            writer.transport.abort()
        host = source.rsplit(":", 1)[0]
        if host not in self._logged_sources:
            self._logged_sources.add(host)
            log.warning("ringtrain job store %s: closed a connection from %s that %s (further refusals "
                        "from %s are counted, not logged)", self.address, source, reason, host)

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        tagger: _Tagger) -> None:
        while True:
            (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
            if size > MAX_MESSAGE_BYTES:
                raise ValueError(f"a {size}-byte request (the limit is {MAX_MESSAGE_BYTES})")
            data = await reader.readexactly(size + _TAG_BYTES)
            body = tagger.open(data[:size], data[size:])
            if not body:
                raise ValueError("an empty request")
            try:
                status, items = await self._answer(body[0], _unpack_items(body, 1))
            except (ValueError, IndexError, struct.error) as exc:
                status, items = _ERROR, [f"bad request: {exc}".encode()]
            writer.write(tagger.seal(bytes([status]) + _pack_items(items)))
            await writer.drain()

    async def _answer(self, op: int, args: list[bytes]) -> tuple[int, list[bytes]]:
        data = self._data
        if op == _SET:
            data[args[0].decode()] = args[1]
            await self._notify()
            return _OK, []
        if op == _GET:
            key = args[0].decode()
            if not await self._wait_for([key], _seconds(args[1])):
                return _TIMEOUT, []
            return _OK, [data[key]]
        if op == _ADD:
            key = args[0].decode()
            value = int(data.get(key, b"0")) + int(args[1])
            data[key] = str(value).encode()
            await self._notify()
            return _OK, [data[key]]
        if op == _CAS:
            key, expected, desired = args[0].decode(), args[1], args[2]
            if data.get(key, b"") == expected and (key in data or expected == b""):
                data[key] = desired
                await self._notify()
            return _OK, [data.get(key, expected)]
        if op == _WAIT:
            keys = [k.decode() for k in args[1:]]
            return (_OK if await self._wait_for(keys, _seconds(args[0])) else _TIMEOUT), []
        if op == _CHECK:
            return _OK, [b"1" if all(k.decode() in data for k in args) else b"0"]
        if op == _DELETE:
            return _OK, [b"1" if data.pop(args[0].decode(), None) is not None else b"0"]
        if op == _NUM_KEYS:
            return _OK, [str(len(data)).encode()]
        if op == _MULTI_GET:
            keys = [k.decode() for k in args[1:]]
            if not await self._wait_for(keys, _seconds(args[0])):
                return _TIMEOUT, []
            return _OK, [data[k] for k in keys]
        if op == _MULTI_SET:
            if len(args) % 2:
                raise ValueError("multi_set needs as many values as keys")
            for raw_key, raw_value in zip(args[0::2], args[1::2]):
                data[raw_key.decode()] = raw_value
            await self._notify()
            return _OK, []
        if op == _APPEND:
            key = args[0].decode()
            data[key] = data.get(key, b"") + args[1]
            await self._notify()
            return _OK, []
        if op == _PING:
            return _OK, []
        raise ValueError(f"unknown operation {op}")

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, keys: list[str], timeout: float | None) -> bool:
        """True once every key exists; False when ``timeout`` seconds (None: no limit) pass first."""
        assert self._changed is not None

        def present() -> bool:
            return all(key in self._data for key in keys)

        if present():
            return True
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(present), timeout)
            except TimeoutError:
                return False
        return True


def _seconds(text: bytes) -> float | None:
    """A timeout in milliseconds on the wire; 0 means none (torch's ``kNoTimeout``)."""
    millis = int(text)
    return None if millis <= 0 else millis / 1000.0


def _millis(timeout: datetime.timedelta) -> bytes:
    return str(max(0, int(timeout.total_seconds() * 1000))).encode()


# ----------------------------------------------------------------------------------------- client
def _as_bytes(value: str | bytes | bytearray | Iterable[int]) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class JobStore(dist.Store):
    """A connection to a :class:`JobStoreServer`, usable wherever torch wants a ``Store``.

    Connecting retries until ``timeout`` (seconds or a timedelta) while nothing listens yet (the
    server may start after its clients). A server that does not prove the secret raises
    :class:`~ringtrain.exceptions.AuthenticationError` at once; so does a server that refuses ours.
    One request at a time travels on the connection (calls from several threads take turns).
    """

    def __init__(self, address: str, secret: str | None,
                 timeout: float | datetime.timedelta = 300.0) -> None:
        super().__init__()
        if not isinstance(timeout, datetime.timedelta):
            timeout = datetime.timedelta(seconds=timeout)
        self.set_timeout(timeout)
        self.address = address
        self._host, self._port = split_address(address)
        self._secret = secret
        self._key = auth.derive_key(secret, _PURPOSE)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._tagger: _Tagger | None = None
        self._connect(time.monotonic() + timeout.total_seconds())

    def _timeout_now(self) -> datetime.timedelta:
        """torch's ``Store.timeout`` (``set_timeout`` changes it), which torch's type stubs lack."""
        return self.timeout  # type: ignore[attr-defined]

    # --- connection -----------------------------------------------------------------------------
    def _connect(self, deadline: float) -> None:
        last: Exception | None = None
        while True:
            try:
                wait = max(0.5, min(HANDSHAKE_TIMEOUT, deadline - time.monotonic()))
                sock = socket.create_connection((self._host, self._port), timeout=wait)
            except OSError as exc:
                last = exc
            else:
                try:
                    self._tagger = self._handshake(sock)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self._sock = sock
                    return
                except AuthenticationError:
                    sock.close()
                    raise
                except OSError as exc:  # the server went away mid-handshake, or was too slow
                    sock.close()
                    last = exc
            if time.monotonic() >= deadline:
                raise JobStoreError(
                    f"cannot reach the job store at {self.address} within "
                    f"{self._timeout_now().total_seconds():g} s: {last}. HINT: check that the launcher (or "
                    "rank 0) is running and that this host reaches that address; behind a firewall, open "
                    "the port for the job's hosts.")
            time.sleep(0.1)

    def _handshake(self, sock: socket.socket) -> _Tagger:
        greeting = bytes(recv_exact(sock, len(_MAGIC) + auth.NONCE_BYTES))
        if greeting[:len(_MAGIC)] != _MAGIC:
            raise AuthenticationError(
                f"the service at {self.address} is not a ringtrain job store (it answered "
                f"{greeting[:len(_MAGIC)]!r}). HINT: {ENV_ADDRESS} or MASTER_ADDR/MASTER_PORT point to "
                "another program; check them, or pick another port.")
        server_nonce = greeting[len(_MAGIC):]
        client_nonce = auth.new_nonce()
        sock.sendall(_MAGIC + client_nonce + auth.proof(self._key, b"client", server_nonce, client_nonce))
        verdict = bytes(recv_exact(sock, 1))
        if verdict != _ACCEPTED:
            raise AuthenticationError(
                f"the job store at {self.address} refused this process: it does not hold the same "
                f"secret. HINT: every process of the job needs the same {ENV_SECRET} (ringtrain run sets "
                "it; with mpirun, srun or torchrun export one value on every rank, or on none).")
        answer = bytes(recv_exact(sock, auth.PROOF_BYTES))
        if not auth.same(answer, auth.proof(self._key, b"server", server_nonce, client_nonce)):
            raise AuthenticationError(
                f"the job store at {self.address} could not prove this job's secret: another program "
                "answers at that address. HINT: check RINGTRAIN_JOB_STORE / MASTER_ADDR / MASTER_PORT.")
        return _Tagger(auth.session_key(self._key, server_nonce, client_nonce), b"c", b"s")

    def close(self) -> None:
        """Close this connection (the server and other clients go on)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def _call(self, op: int, items: Sequence[bytes], wait: float | None = None) -> list[bytes]:
        """One request and its reply; ``wait`` is how long the server may block on it (seconds)."""
        with self._lock:
            if self._sock is None or self._tagger is None:
                raise JobStoreError(f"the connection to the job store at {self.address} is closed")
            sock = self._sock
            # A blocking request may take as long as its own timeout; the margin covers the network.
            limit = self._timeout_now().total_seconds() if wait is None else wait
            sock.settimeout(None if limit <= 0 else limit + 30.0)
            try:
                sock.sendall(self._tagger.seal(bytes([op]) + _pack_items(items)))
                (size,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
                if size > MAX_MESSAGE_BYTES:
                    raise ValueError(f"a {size}-byte reply")
                data = bytes(recv_exact(sock, size + _TAG_BYTES))
                body = self._tagger.open(data[:size], data[size:])
                status, reply = body[0], _unpack_items(body, 1)
            except (OSError, ValueError, IndexError, struct.error) as exc:
                self._sock = None
                sock.close()
                raise JobStoreError(
                    f"lost the connection to the job store at {self.address}: {exc}. HINT: the launcher or "
                    "rank 0 that hosts it has probably exited; look for its error first.") from None
            except BaseException:
                # A signal handler raised mid-request (Ctrl-C, torch's SignalException): the reply, or
                # the rest of it, is still on its way, and the next request would read it as its own.
                self._sock = None
                sock.close()
                raise
        if status == _TIMEOUT:
            raise dist.DistStoreError(
                f"timed out after {limit:g} s waiting in the job store at {self.address} for "
                f"{[k.decode(errors='replace') for k in items[1:]] if op != _GET else items[0].decode()}")
        if status != _OK:
            raise JobStoreError(f"the job store at {self.address} refused a request: "
                                f"{b''.join(reply).decode(errors='replace')}")
        return reply

    # --- torch.distributed.Store ----------------------------------------------------------------
    def set(self, key: str, value: str | bytes) -> None:
        self._call(_SET, [key.encode(), _as_bytes(value)])

    def get(self, key: str) -> bytes:
        wait = self._timeout_now()
        return self._call(_GET, [key.encode(), _millis(wait)], wait.total_seconds())[0]

    def add(self, key: str, value: int) -> int:
        return int(self._call(_ADD, [key.encode(), str(int(value)).encode()])[0])

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self._call(_CAS, [key.encode(), _as_bytes(expected_value), _as_bytes(desired_value)])[0]

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        wait = self._timeout_now() if timeout is None else timeout
        self._call(_WAIT, [_millis(wait), *(k.encode() for k in keys)], wait.total_seconds())

    def check(self, keys: list[str]) -> bool:
        return self._call(_CHECK, [k.encode() for k in keys])[0] == b"1"

    def delete_key(self, key: str) -> bool:
        return self._call(_DELETE, [key.encode()])[0] == b"1"

    def num_keys(self) -> int:
        return int(self._call(_NUM_KEYS, [])[0])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        wait = self._timeout_now()
        return self._call(_MULTI_GET, [_millis(wait), *(k.encode() for k in keys)], wait.total_seconds())

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        if len(keys) != len(values):
            raise ValueError(f"multi_set got {len(keys)} keys but {len(values)} values")
        items: list[bytes] = []
        for key, value in zip(keys, values):
            items += [key.encode(), _as_bytes(value)]
        self._call(_MULTI_SET, items)

    def append(self, key: str, value: str | bytes) -> None:
        self._call(_APPEND, [key.encode(), _as_bytes(value)])

    @property
    def secret(self) -> str | None:
        """The job's secret this connection proved (None: an unauthenticated job)."""
        return self._secret

    def clone(self) -> JobStore:
        """A second, independent connection to the same store."""
        return JobStore(self.address, self._secret, self._timeout_now())

    def __repr__(self) -> str:
        return f"JobStore({self.address!r})"
