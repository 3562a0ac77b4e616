"""A Ray node's agent, run apart from any Ray actor: its link to the driver over one TCP connection.

A Ray actor is a Ray worker process, whose own threads take CPU all the time (about 1.5 % of a core,
measured), CPU that the ranks beside it lose for the whole job. So ``ringtrain run --ray`` uses its
node actor only to start this *bridge* on the node and then ends the actor (the placement group keeps
the node's CPUs and GPUs reserved). The bridge is what ssh's session is for a host of an ssh job:

* it starts the node's agent (``python -m ringtrain.launch.node_entry CONFIG_JSON``) with its pipes,
  and writes the job's secret as the first line of its stdin (the secret came to the actor through
  Ray's object store and reaches the bridge on a pipe: never on a command line, never on the network
  connection below);
* it connects to the driver, proves that it knows this node's one-time token (the handshake of
  :mod:`ringtrain.engine.auth`, mutual: nobody else can pose as the node or as the driver), and from
  then on carries the agent's stdout and stderr to the driver and the driver's link requests
  (:mod:`ringtrain.launch.link`: heartbeats, stop, kill, signals) to the agent's stdin, in frames
  (:func:`frame`);
* it watches the node's raylet: when that ends (``ray stop --force``, the node lost), the bridge tells
  the driver (:data:`LOST`) and closes the agent's stdin, which stops the ranks as a cut ssh session
  does. A driver that goes away closes the connection, with the same effect.

It detaches itself from the actor (a fork, a session of its own), so that Ray ending the actor's
worker process does not end it. Standard library only, and nothing of ringtrain that imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ringtrain.engine import auth
from ringtrain.engine.netutil import recv_exact

# --- the wire --------------------------------------------------------------------------------------
#: Frames from the bridge: the agent's pid, a piece of its stdout or stderr, its exit status (after
#: every byte of output), the node lost (a reason in words).
PID, STDOUT, STDERR, EXIT, LOST = b"P", b"O", b"E", b"X", b"L"
#: Frames from the driver: bytes for the agent's stdin, end-of-file on it, SIGKILL to its processes.
STDIN, CLOSE, KILL = b"I", b"C", b"K"
#: A frame's head: its kind (one byte) and the length of what follows (4 bytes, big-endian).
HEAD = struct.Struct(">cI")
#: Most bytes of one frame's payload (a read of the agent's pipes is at most this).
MAX_PAYLOAD = 1 << 16
#: The key purpose of the handshake (a token proven for this is proof of nothing else).
PURPOSE = "ray node bridge"
#: Seconds the bridge tries to reach the driver, and the driver waits for the bridge.
CONNECT_TIMEOUT_S = 60.0
#: Seconds between two looks at the raylet where the kernel cannot say when it ends (no pidfd).
RAYLET_POLL_S = 1.0


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame of ``kind`` carrying ``payload``."""
    return HEAD.pack(kind, len(payload)) + payload


def recv_frame(sock: socket.socket) -> tuple[bytes, bytes]:
    """The next frame on ``sock``: its kind and payload."""
    kind, length = HEAD.unpack(recv_exact(sock, HEAD.size))
    if length > MAX_PAYLOAD:
        raise ConnectionError(f"a frame of {length} bytes, more than {MAX_PAYLOAD}: not a ringtrain bridge")
    return kind, bytes(recv_exact(sock, length)) if length else b""


def prove_to_driver(sock: socket.socket, token: str, node: int) -> None:
    """The bridge's half of the handshake, as node ``node``; ConnectionError where the driver fails it."""
    key = auth.derive_key(token, PURPOSE)
    server_nonce = recv_exact(sock, auth.NONCE_BYTES)
    client_nonce = auth.new_nonce()
    claims = struct.pack(">I", node)
    sock.sendall(client_nonce + claims + auth.proof(key, b"client", server_nonce, client_nonce, claims))
    answer = recv_exact(sock, auth.PROOF_BYTES)
    if not auth.same(answer, auth.proof(key, b"server", server_nonce, client_nonce, claims)):
        raise ConnectionError("the driver's answer does not prove the job's token: not our driver")


def check_bridge(sock: socket.socket, token: str, node: int) -> bool:
    """The driver's half of the handshake: True once the peer proved the token as node ``node``."""
    key = auth.derive_key(token, PURPOSE)
    server_nonce = auth.new_nonce()
    sock.sendall(server_nonce)
    client_nonce = recv_exact(sock, auth.NONCE_BYTES)
    claims = recv_exact(sock, 4)
    given = recv_exact(sock, auth.PROOF_BYTES)
    if struct.unpack(">I", claims)[0] != node or \
            not auth.same(given, auth.proof(key, b"client", server_nonce, client_nonce, claims)):
        return False
    sock.sendall(auth.proof(key, b"server", server_nonce, client_nonce, claims))
    return True


# --- the bridge ----------------------------------------------------------------------------------

class Bridge:
    """The agent's pipes on one side, the driver's connection on the other, the raylet watched."""

    def __init__(self, sock: socket.socket, agent: subprocess.Popen[bytes], raylet_pid: int) -> None:
        self.sock = sock
        self.agent = agent
        self.raylet_pid = raylet_pid
        self.raylet_fd: int | None = None
        if raylet_pid > 0:
            with contextlib.suppress(OSError, AttributeError):
                self.raylet_fd = os.pidfd_open(raylet_pid)  # readable once the raylet has ended
        self.connected = True
        self.node_lost = False

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        """A frame to the driver; a broken connection is noted (the agent is stopped by the loop)."""
        if not self.connected:
            return
        try:
            self.sock.sendall(frame(kind, payload))
        except OSError:
            self.disconnected()

    def disconnected(self) -> None:
        """The driver is gone (or cut off): end-of-file on the agent's stdin stops its ranks."""
        self.connected = False
        self.close_stdin()
        with contextlib.suppress(OSError):
            self.sock.close()

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.agent.stdin.close()  # type: ignore[union-attr]

    def to_agent(self, data: bytes) -> None:
        # a full pipe skips a heartbeat rather than block the relay of the agent's output
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.write(self.agent.stdin.fileno(), data)  # type: ignore[union-attr]

    def raylet_gone(self) -> bool:
        try:
            os.kill(self.raylet_pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # there, but another user's: alive
            pass
        return False

    def on_driver_frame(self) -> None:
        try:
            kind, payload = recv_frame(self.sock)
        except (OSError, ConnectionError, struct.error):
            self.disconnected()
            return
        if kind == STDIN:
            self.to_agent(payload)
        elif kind == CLOSE:
            self.close_stdin()
        elif kind == KILL:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.agent.pid, signal.SIGKILL)

    def on_raylet_end(self) -> None:
        self.node_lost = True
        if self.raylet_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.raylet_fd)
            self.raylet_fd = None
        self.send(LOST, f"its raylet (pid {self.raylet_pid}) ended: the Ray node is gone".encode())
        self.close_stdin()

    def run(self) -> int:
        """Relay until the agent has ended and said everything; returns its exit status."""
        streams = {self.agent.stdout.fileno(): STDOUT, self.agent.stderr.fileno(): STDERR}  # type: ignore[union-attr]
        os.set_blocking(self.agent.stdin.fileno(), False)  # type: ignore[union-attr]
        self.send(PID, str(self.agent.pid).encode())
        while streams:
            watched = list(streams)
            if self.connected:
                watched.append(self.sock.fileno())
            if self.raylet_fd is not None:
                watched.append(self.raylet_fd)
            polling = self.raylet_fd is None and self.raylet_pid > 0 and not self.node_lost
            ready, _, _ = select.select(watched, [], [], RAYLET_POLL_S if polling else None)
            for fd in ready:
                if fd in streams:
                    data = os.read(fd, MAX_PAYLOAD)
                    if data:
                        self.send(streams[fd], data)
                    else:
                        del streams[fd]
                elif fd == self.raylet_fd:
                    self.on_raylet_end()
                elif self.connected and fd == self.sock.fileno():
                    self.on_driver_frame()
            if polling and self.raylet_gone():
                self.on_raylet_end()
        code = self.agent.wait()
        self.send(EXIT, str(code).encode())
        with contextlib.suppress(OSError):
            self.sock.close()
        return code


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    """A connection to the driver, tried again until ``timeout`` s have passed (it may listen late)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(address, timeout=max(1.0, deadline - time.monotonic()))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def start_agent(argv: Sequence[str], env: Mapping[str, str], secret: str,
                cwd: str | None) -> subprocess.Popen[bytes]:
    """The agent, with this interpreter as ``argv[0]``, its pipes held here, the secret its first line."""
    pipe = subprocess.PIPE
    agent = subprocess.Popen([sys.executable, *list(argv)[1:]], env=dict(env), stdin=pipe, stdout=pipe,
                             stderr=pipe, start_new_session=True,
                             cwd=cwd if cwd and os.path.isdir(cwd) else None)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        agent.stdin.write(secret.encode() + b"\n")  # type: ignore[union-attr]
        agent.stdin.flush()  # type: ignore[union-attr]
    return agent


def serve(order: Mapping[str, Any]) -> int:
    """Connect to the driver, start the agent, relay: the detached bridge's whole life."""
    from ringtrain.launch.link import note_on_host

    host = socket.gethostname()
    try:
        sock = connect((order["driver_host"], int(order["driver_port"])), CONNECT_TIMEOUT_S)
        sock.settimeout(CONNECT_TIMEOUT_S)
        prove_to_driver(sock, order["token"], int(order["node"]))
        sock.settimeout(None)
    except (OSError, ConnectionError) as exc:
        note_on_host(host, f"ray node bridge: could not reach the driver at {order['driver_host']}:"
                           f"{order['driver_port']} ({exc}); the agent was not started")
        return 1
    agent = start_agent(order["argv"], order["env"], order.get("secret", ""), order.get("cwd"))
    return Bridge(sock, agent, int(order.get("raylet_pid", 0))).run()


def main() -> int:
    """Read the order (JSON) on stdin, fork off the bridge, print its pid, and end."""
    order = json.loads(sys.stdin.buffer.readline())
    pid = os.fork()
    if pid:
        print(pid, flush=True)
        return 0
    # The bridge: a session of its own, nothing of the actor's pipes kept (the actor ends soon).
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os._exit(serve(order) & 0xFF)


if __name__ == "__main__":
    sys.exit(main())
