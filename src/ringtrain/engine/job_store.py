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
refused at once), so idle or slow connections cannot hold up the ranks, nor can a flood of new ones.
The bound follows the process's file-descriptor limit (half of it, which the server first raises to the
hard limit), so a legitimate start-up burst of thousands of ranks is served without refusals; a flood
then has to open that many connections each ``handshake_grace`` seconds to keep a rank out. Whatever
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
import hmac
import logging
import random
import socket
import struct
import threading
import time
from collections.abc import Iterable, Sequence

import torch.distributed as dist

from ringtrain.engine import auth
from ringtrain.engine.auth import ENV_ADDRESS, ENV_SECRET, new_secret, secret_from_environ
from ringtrain.engine.netutil import PeerClosedError, open_listener, recv_exact
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
#: Fewest handshakes in progress at once that the bound allows (see :func:`default_max_handshakes`); a new
#: connection beyond the bound closes the oldest unproven one (once that one is older than
#: HANDSHAKE_GRACE; until then the newcomer is refused).
MAX_HANDSHAKES = 128
#: File descriptors the server keeps out of the handshake bound: proven connections, logs, files.
_RESERVED_FDS = 256
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
        # hmac.digest: OpenSSL's one-shot HMAC, a few microseconds less per message than hmac.new
        return hmac.digest(self._key, label + struct.pack("<Q", number) + body, "sha256")

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



def default_max_handshakes() -> int:
    """How many handshakes may be in progress at once: half this process's file-descriptor limit.

    A job's ranks all connect at start-up, within a fraction of a second at thousands of ranks, and the
    server proves them one by one on its loop: a small bound (128) refused most of a 4,096-rank burst,
    which then retried. Half the descriptors leaves the other half for the proven connections.
    """
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return MAX_HANDSHAKES
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(MAX_HANDSHAKES, (soft - _RESERVED_FDS) // 2)


def raise_fd_limit() -> int:
    """Raise this process's soft file-descriptor limit to its hard limit; returns the soft limit now.

    The store holds one connection per rank (and per agent): the usual soft limit of 1,024 would stop a
    job of a thousand ranks at accept(). Only the soft limit moves, which any process may do.
    """
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
        if soft != resource.RLIM_INFINITY and soft < hard:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return -1


def _quiet_about_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The shutting-down loop's exception handler: a cancelled task is no error, the rest is reported."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)

class JobStoreServer:
    """The job store's server, in a thread of its own; ``address`` is what clients connect to.

    ``secret`` None serves an unauthenticated job (any client that speaks the protocol gets in).
    ``max_handshakes`` None: :func:`default_max_handshakes`, after raising the file-descriptor limit.
    Raises OSError naming the address when it cannot listen there.

    Each connection is an asyncio protocol that answers a request as soon as its bytes are in, in the
    callback that received them: no task or coroutine per connection or request (a stream-based server
    spent three times the CPU of torch's TCPStore per request at a 4,096-rank start-up).
    """

    def __init__(self, secret: str | None, host: str = "127.0.0.1", port: int = 0, *,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT, max_handshakes: int | None = None,
                 handshake_grace: float = HANDSHAKE_GRACE) -> None:
        self._key = auth.derive_key(secret, _PURPOSE)
        self.handshake_timeout = handshake_timeout
        self.handshake_grace = handshake_grace
        if max_handshakes is None:
            raise_fd_limit()
            max_handshakes = default_max_handshakes()
        self.max_handshakes = max(1, max_handshakes)
        try:
            listener = open_listener(host, port, backlog=4096)
        except OSError as exc:
            raise OSError(exc.errno, f"the job store cannot listen on {join_address(host, port)}: "
                                     f"{exc.strerror}") from None
        self.host = host
        self.port: int = listener.getsockname()[1]
        #: Connections refused so far (wrong secret, not a ringtrain client, garbage, too slow).
        self.refused = 0
        #: Connections accepted, handshakes proven and requests answered so far (what the scale
        #: benchmark divides by the number of ranks).
        self.accepted = 0
        self.proven = 0
        self.requests = 0
        self._logged_sources: set[str] = set()
        self._data: dict[str, bytes] = {}
        self._pending: dict[_Connection, float] = {}  # handshakes in progress, oldest first: since when
        self._clients: set[_Connection] = set()
        # Requests blocked until a key exists, by the key they wait for: a write wakes only its own
        # key's waiters (one condition for all woke every waiter at every write: N² at start-up).
        self._waiters: dict[str, set[_Waiter]] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
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
            self._server = await self._loop.create_server(lambda: _Connection(self), sock=listener,
                                                          backlog=4096)

        try:
            self._loop.run_until_complete(start())
        finally:
            ready.set()
        try:
            self._loop.run_forever()
        finally:
            if self._server is not None:
                self._server.close()
            for connection in [*self._pending, *self._clients]:
                connection.abort()
            # An aborted transport closes its socket in a callback: run them, or clients blocked in a
            # wait would see their connection close only when this process exits.
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.set_exception_handler(_quiet_about_cancelled)
            for _ in range(10):
                tasks = asyncio.all_tasks(self._loop)
                if not tasks:
                    break
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(Exception):
                    self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    def _admit(self, connection: _Connection) -> bool:
        """Whether a new connection may start its handshake (bounded, see the module's docstring)."""
        self.accepted += 1
        if len(self._pending) >= self.max_handshakes:
            oldest, since = next(iter(self._pending.items()))
            if self._loop.time() - since < self.handshake_grace:
                # Every slot holds a handshake younger than its grace: this newcomer is refused at once
                # (a rank retries). Pushing out the oldest instead let a flood, accepted up to a
                # thousand at a time, push out a rank's handshake before it could answer, again and
                # again (measured: no rank connection in 15 s under a loopback flood).
                connection.refuse(f"came while {self.max_handshakes} younger handshakes were in progress")
                return False
            oldest.refuse(f"gave way to newer connections ({self.max_handshakes} handshakes were in "
                          "progress)")
        self._pending[connection] = self._loop.time()
        return True

    def _refused(self, source: str, reason: str) -> None:
        self.refused += 1
        host = source.rsplit(":", 1)[0]
        if host not in self._logged_sources:
            self._logged_sources.add(host)
            log.warning("ringtrain job store %s: closed a connection from %s that %s (further refusals "
                        "from %s are counted, not logged)", self.address, source, reason, host)

    def _answer(self, op: int, args: list[bytes],
                connection: _Connection) -> tuple[int, list[bytes]] | None:
        """The reply to one request, or None when it waits for keys (the waiter replies later)."""
        data = self._data
        if op == _GET:
            return self._wait(connection, [args[0].decode()], _seconds(args[1]))
        if op == _WAIT:
            return self._wait(connection, [k.decode() for k in args[1:]], _seconds(args[0]), values=False)
        if op == _MULTI_GET:
            return self._wait(connection, [k.decode() for k in args[1:]], _seconds(args[0]))
        if op == _SET:
            key = args[0].decode()
            data[key] = args[1]
            self._wake(key)
            return _OK, []
        if op == _ADD:
            key = args[0].decode()
            value = int(data.get(key, b"0")) + int(args[1])
            data[key] = str(value).encode()
            self._wake(key)
            return _OK, [data[key]]
        if op == _CAS:
            key, expected, desired = args[0].decode(), args[1], args[2]
            if data.get(key, b"") == expected and (key in data or expected == b""):
                data[key] = desired
                self._wake(key)
            return _OK, [data.get(key, expected)]
        if op == _CHECK:
            return _OK, [b"1" if all(k.decode() in data for k in args) else b"0"]
        if op == _DELETE:
            return _OK, [b"1" if data.pop(args[0].decode(), None) is not None else b"0"]
        if op == _NUM_KEYS:
            return _OK, [str(len(data)).encode()]
        if op == _MULTI_SET:
            if len(args) % 2:
                raise ValueError("multi_set needs as many values as keys")
            for raw_key, raw_value in zip(args[0::2], args[1::2]):
                data[raw_key.decode()] = raw_value
                self._wake(raw_key.decode())
            return _OK, []
        if op == _APPEND:
            key = args[0].decode()
            data[key] = data.get(key, b"") + args[1]
            self._wake(key)
            return _OK, []
        if op == _PING:
            return _OK, []
        raise ValueError(f"unknown operation {op}")

    def _wait(self, connection: _Connection, keys: list[str], timeout: float | None, *,
              values: bool = True) -> tuple[int, list[bytes]] | None:
        waiter = _Waiter(self, connection, keys, values)
        if waiter.missing() is None:
            return waiter.reply()
        if timeout is not None:
            waiter.timer = self._loop.call_later(timeout, waiter.time_out)
        waiter.park()
        connection.wait_on(waiter)
        return None

    def _wake(self, key: str) -> None:
        """Look again at the requests waiting for ``key`` (it now exists)."""
        for waiter in self._waiters.pop(key, ()):
            waiter.look_again()


class _Waiter:
    """A GET, WAIT or MULTI_GET waiting for keys: it replies once they exist or its time runs out."""

    def __init__(self, server: JobStoreServer, connection: _Connection, keys: list[str],
                 values: bool) -> None:
        self.server, self.connection, self.keys, self.values = server, connection, keys, values
        self.timer: asyncio.TimerHandle | None = None
        self.parked_on: str | None = None

    def missing(self) -> str | None:
        data = self.server._data
        return next((key for key in self.keys if key not in data), None)

    def reply(self) -> tuple[int, list[bytes]]:
        data = self.server._data
        return _OK, ([data[key] for key in self.keys] if self.values else [])

    def park(self) -> None:
        """Wait for the first missing key alone; the others are looked at again once it exists."""
        key = self.missing()
        assert key is not None
        self.parked_on = key
        self.server._waiters.setdefault(key, set()).add(self)

    def look_again(self) -> None:
        self.parked_on = None
        if self.missing() is not None:
            self.park()
            return
        self.finish(self.reply())

    def time_out(self) -> None:
        self.timer = None
        self.unpark()
        self.finish((_TIMEOUT, []))

    def unpark(self) -> None:
        if self.parked_on is not None:
            waiting = self.server._waiters.get(self.parked_on)
            if waiting is not None:
                waiting.discard(self)
                if not waiting:
                    del self.server._waiters[self.parked_on]
            self.parked_on = None

    def cancel(self) -> None:
        """The connection went away: forget this request."""
        self.unpark()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def finish(self, answer: tuple[int, list[bytes]]) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.connection.waiter_done(self, answer)


class _Connection(asyncio.Protocol):
    """One client's connection: the handshake, then requests answered in the order they came."""

    def __init__(self, server: JobStoreServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.source = "?"
        self.buffer = bytearray()
        self.tagger: _Tagger | None = None
        self.server_nonce = b""
        self.deadline: asyncio.TimerHandle | None = None
        self.waiter: _Waiter | None = None
        self.closed = False

    # --- asyncio's callbacks --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")  # (asyncio's transports set TCP_NODELAY themselves)
        self.source = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if not self.server._admit(self):
            return
        self.server_nonce = auth.new_nonce()
        transport.write(_MAGIC + self.server_nonce)
        self.deadline = self.server._loop.call_later(
            self.server.handshake_timeout, self.refuse,
            f"sent no valid proof within {self.server.handshake_timeout:g} s")

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buffer += data
        try:
            self._process()
        except ValueError as exc:
            self.refuse(f"broke the protocol after its handshake: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and self in self.server._pending:
            self.refuse("closed the connection before proving the job's secret")
        self._forget()

    # --- the protocol ---------------------------------------------------------------------------
    def _process(self) -> None:
        buffer = self.buffer
        while not self.closed and self.waiter is None:
            if self.tagger is None:
                if not self._handshake():
                    return
                continue
            if len(buffer) < _LENGTH.size:
                return
            (size,) = _LENGTH.unpack_from(buffer)
            if size > MAX_MESSAGE_BYTES:
                raise ValueError(f"a {size}-byte request (the limit is {MAX_MESSAGE_BYTES})")
            end = _LENGTH.size + size + _TAG_BYTES
            if len(buffer) < end:
                return
            body = self.tagger.open(bytes(buffer[_LENGTH.size:end - _TAG_BYTES]),
                                    bytes(buffer[end - _TAG_BYTES:end]))
            del buffer[:end]
            if not body:
                raise ValueError("an empty request")
            self.server.requests += 1
            try:
                answer = self.server._answer(body[0], _unpack_items(body, 1), self)
            except (ValueError, IndexError, struct.error) as exc:
                answer = _ERROR, [f"bad request: {exc}".encode()]
            if answer is not None:
                self._send(answer)

    def _handshake(self) -> bool:
        """Check the client's proof once it is in; True when proven (the buffer then holds requests)."""
        buffer = self.buffer
        if len(buffer) >= len(_MAGIC) and buffer[:len(_MAGIC)] != _MAGIC:
            self.refuse("is not a ringtrain job store client (wrong greeting)")
            return False
        end = len(_MAGIC) + auth.NONCE_BYTES + auth.PROOF_BYTES
        if len(buffer) < end:
            return False
        client_nonce = bytes(buffer[len(_MAGIC):len(_MAGIC) + auth.NONCE_BYTES])
        claimed = bytes(buffer[len(_MAGIC) + auth.NONCE_BYTES:end])
        key = self.server._key
        if not auth.same(claimed, auth.proof(key, b"client", self.server_nonce, client_nonce)):
            # A client of another job (or an unauthenticated one) learns why, and says so clearly.
            self.refuse("did not prove the job's secret", verdict=_REFUSED)
            return False
        del buffer[:end]
        # Proven: no longer an unauthenticated handshake that a flood of newer ones may push out.
        self.server._pending.pop(self, None)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.server.proven += 1
        self.server._clients.add(self)
        assert self.transport is not None
        self.transport.write(_ACCEPTED + auth.proof(key, b"server", self.server_nonce, client_nonce))
        self.tagger = _Tagger(auth.session_key(key, self.server_nonce, client_nonce), b"s", b"c")
        return True

    def _send(self, answer: tuple[int, list[bytes]]) -> None:
        status, items = answer
        assert self.transport is not None
        assert self.tagger is not None
        self.transport.write(self.tagger.seal(bytes([status]) + _pack_items(items)))

    def wait_on(self, waiter: _Waiter) -> None:
        """A request waits for keys: read nothing more from this client until it is answered (the
        kernel's buffers hold what a client sends meanwhile, not this process's memory)."""
        self.waiter = waiter
        if self.transport is not None:
            self.transport.pause_reading()

    def waiter_done(self, waiter: _Waiter, answer: tuple[int, list[bytes]]) -> None:
        """A waiting request's reply; the requests that came behind it are answered next."""
        if self.waiter is not waiter or self.closed:
            return
        self.waiter = None
        if self.transport is not None:
            self.transport.resume_reading()
        self._send(answer)
        try:
            self._process()
        except ValueError as exc:
            self.refuse(f"broke the protocol after its handshake: {exc}")

    # --- the end --------------------------------------------------------------------------------
    def refuse(self, reason: str, verdict: bytes = b"") -> None:
        """Close this connection as not one of the job's, counted and logged (see ``_refused``)."""
        if self.closed:
            return
        self.server._refused(self.source, reason)
        if self.transport is not None:
            if verdict:
                self.transport.write(verdict)
                self.transport.close()  # sends the verdict, then closes
            else:
                self.transport.abort()
        self._forget()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._forget()

    def _forget(self) -> None:
        self.closed = True
        self.server._pending.pop(self, None)
        self.server._clients.discard(self)
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        if self.waiter is not None:
            self.waiter.cancel()
            self.waiter = None
        self.buffer.clear()


def _seconds(text: bytes) -> float | None:
    """A timeout in milliseconds on the wire; 0 means none (torch's ``kNoTimeout``)."""
    millis = int(text)
    return None if millis <= 0 else millis / 1000.0


def retry_delay(attempt: int) -> float:
    """Seconds before connecting again after ``attempt`` failed tries: 0.05 s doubling to 1 s, +-50 %.

    Thousands of ranks refused (or early for the server) at the same moment would otherwise come back
    at the same moment too; the jitter spreads them, the cap keeps a late server's wait short.
    """
    return min(1.0, 0.05 * 2 ** min(attempt, 5)) * random.uniform(0.5, 1.5)


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
        self._limit: float | None = None  # the kernel timeout the socket has now (seconds; 0: none)
        self._connect(time.monotonic() + timeout.total_seconds())

    def _timeout_now(self) -> datetime.timedelta:
        """torch's ``Store.timeout`` (``set_timeout`` changes it), which torch's type stubs lack."""
        return self.timeout  # type: ignore[attr-defined]

    # --- connection -----------------------------------------------------------------------------
    def _connect(self, deadline: float) -> None:
        last: Exception | None = None
        attempt = 0
        while True:
            try:
                wait = max(0.5, min(HANDSHAKE_TIMEOUT, deadline - time.monotonic()))
                sock = socket.create_connection((self._host, self._port), timeout=wait)
            except OSError as exc:
                last = exc
            else:
                try:
                    # Blocking from here on, with the kernel's timeouts (SO_RCVTIMEO): a socket with a
                    # Python timeout polls before every recv and send, which doubles each request's
                    # system calls (measured: the client's CPU was most of a 4,096-rank start-up).
                    sock.settimeout(None)
                    self._limit = None
                    self._set_limit(sock, wait)
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
            time.sleep(min(retry_delay(attempt), max(0.0, deadline - time.monotonic())))
            attempt += 1

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
        # The verdict and the server's proof come in one segment: read them in one call where they do.
        reply = sock.recv(1 + auth.PROOF_BYTES)
        if not reply:
            raise PeerClosedError("the job store closed the connection during the handshake")
        verdict = reply[:1]
        if verdict != _ACCEPTED:
            raise AuthenticationError(
                f"the job store at {self.address} refused this process: it does not hold the same "
                f"secret. HINT: every process of the job needs the same {ENV_SECRET} (ringtrain run sets "
                "it; with mpirun, srun or torchrun export one value on every rank, or on none).")
        answer = reply[1:]
        if len(answer) < auth.PROOF_BYTES:
            answer += bytes(recv_exact(sock, auth.PROOF_BYTES - len(answer)))
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
            try:
                self._set_limit(sock, 0.0 if limit <= 0 else limit + 30.0)
                sock.sendall(self._tagger.seal(bytes([op]) + _pack_items(items)))
                data = self._receive(sock)
                body = self._tagger.open(data[:-_TAG_BYTES], data[-_TAG_BYTES:])
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

    def _set_limit(self, sock: socket.socket, seconds: float) -> None:
        """Let a recv or send on ``sock`` block at most ``seconds`` (0: without a limit)."""
        if seconds == self._limit:
            return
        whole = int(seconds)
        value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._limit = seconds

    def _receive(self, sock: socket.socket) -> bytes:
        """One reply's body and tag, read in as few system calls as it arrives in (usually one)."""
        try:
            data = sock.recv(65536)
            while True:
                if not data:
                    raise ConnectionError("the job store closed the connection")
                need = _LENGTH.size
                if len(data) >= _LENGTH.size:
                    (size,) = _LENGTH.unpack_from(data)
                    if size > MAX_MESSAGE_BYTES:
                        raise ValueError(f"a {size}-byte reply")
                    need += size + _TAG_BYTES
                    if len(data) == need:
                        return data[_LENGTH.size:]
                    if len(data) > need:
                        raise ValueError("bytes after the reply (one request at a time travels)")
                more = sock.recv(max(65536, need - len(data)))
                if not more:
                    raise ConnectionError("the job store closed the connection mid-reply")
                data += more
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise TimeoutError(f"no reply within {self._limit:g} s") from None

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
