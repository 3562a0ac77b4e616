"""A group of ranks on one Ray node whose agent talks to the driver over a bridge, not through an actor.

The fixed-size ``ringtrain run --ray`` job's place (:class:`~ringtrain.launch.ray.driver.RayJob`). Its
node actor starts the agent behind a bridge (:mod:`ringtrain.launch.ray.bridge`), which connects back
to this driver and proves the node's one-time token; then the actor is ended. From there the group
is what an ssh host's is: the agent's output comes as it is written, the link's heartbeats and
requests go to the agent's stdin, and no Ray call is made while the job runs (an actor call per
output line and per heartbeat, and the actor's own worker process, cost CPU that the ranks lose).

A lost node: the bridge says its raylet ended (:data:`~ringtrain.launch.ray.bridge.LOST`), or the
connection breaks; the group then ends at once with :data:`~ringtrain.launch.ray.group.LOST_EXIT`
and names its node and ranks, as the actor's group does. A node that goes silent (its host down, the
network cut) is given up after the link's silence limit, as an ssh host is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, ClassVar

from ringtrain.engine.netutil import open_listener
from ringtrain.launch.link import DriverEnd
from ringtrain.launch.ray import bridge as ray_bridge
from ringtrain.launch.ray.group import KILL_WAIT_S, LOST_EXIT, RayGroup
from ringtrain.launch.supervision import Reach


class NodeLost(ConnectionError):
    """The bridge's word that its Ray node went (its raylet ended), or its connection broke."""


class BridgeEnd(DriverEnd):
    """The driver's end of the link, written in frames on the bridge's connection (the bridge passes
    them to the agent's stdin)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(None, talks=True)
        self.sock = sock
        self._send_lock = threading.Lock()

    def send_frame(self, kind: bytes, payload: bytes = b"") -> bool:
        try:
            with self._send_lock:
                self.sock.sendall(ray_bridge.frame(kind, payload))
            return True
        except OSError:
            return False

    def write(self, data: bytes) -> bool:
        return self.send_frame(ray_bridge.STDIN, data)

    def close(self) -> None:
        self.send_frame(ray_bridge.CLOSE)


class BridgedRayGroup(RayGroup):
    """The driver's side of one Ray node's agent behind its bridge (see the module doc).

    ``actor`` starts the bridge and is ended once the bridge has connected; ``index``: the node's
    index in the job (what its bridge proves it is); ``listen_host``: the driver's address as the
    Ray nodes reach it; ``token``: the job's bridge token (``token_ref``: the same as a Ray object
    reference, so that it never shows in Ray's task listings). Other arguments as :class:`RayGroup`.
    """

    kind: ClassVar[str] = "ray-bridged"

    def __init__(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 actor: Any, node: Mapping[str, str], ranks: range, index: int, listen_host: str,
                 token: str, token_ref: Any, secret_ref: Any = None, reach: Reach | None = None,
                 lock: threading.Lock | None = None, on_error_line: Callable[[str], bool] | None = None,
                 out: IO[str] | None = None, err: IO[str] | None = None,
                 connect_timeout: float = ray_bridge.CONNECT_TIMEOUT_S) -> None:
        import ray

        super(RayGroup, self).__init__(host, lock=lock, on_error_line=on_error_line, out=out, err=err)
        self._init_state(actor, node, ranks)
        cwd = (reach or Reach()).cwd or os.getcwd()
        with open_listener(listen_host) as listener:
            port = listener.getsockname()[1]
            started = actor.start_bridge.remote(list(argv), dict(env or {}),
                                                [secret_ref] if secret_ref is not None else [], cwd,
                                                [listen_host, port], index, [token_ref])
            ray.get(started, timeout=connect_timeout)
            sock = self._accept(listener, token, index, connect_timeout)
        kind, payload = ray_bridge.recv_frame(sock)
        if kind != ray_bridge.PID:
            raise ConnectionError(f"the bridge on Ray node {node.get('node_ip')} spoke out of turn "
                                  f"({kind!r})")
        self._pid = int(payload)
        self.link = BridgeEnd(sock)
        self.hearing = self.link
        # The bridge runs on its own now: the actor's worker process would only take CPU from the ranks
        # (the placement group keeps the node's CPUs and GPUs reserved).
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        self._relay = threading.Thread(target=self._receive, name=f"ringtrain-ray-bridge-{host}", daemon=True)
        self._relay.start()

    def _accept(self, listener: socket.socket, token: str, index: int, timeout: float) -> socket.socket:
        """The first connection on ``listener`` that proves ``token`` as node ``index`` (others are
        closed), within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                where = listener.getsockname()
                raise TimeoutError(
                    f"the agent of Ray node {self.node.get('node_ip', '?')} (host {self.host}) did not "
                    f"connect back to this driver at {where[0]}:{where[1]} within {timeout:g} s. "
                    "HINT: the Ray nodes must reach the driver's address, as Ray itself needs (a firewall "
                    "between them?); that node's $TMPDIR/ringtrain-agents-*.log says why")
            listener.settimeout(left)
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(max(1.0, min(left, 10.0)))
            try:
                if ray_bridge.check_bridge(sock, token, index):
                    sock.settimeout(None)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return sock
            except (OSError, ConnectionError, struct.error):
                pass
            sock.close()

    # --- output ----------------------------------------------------------------------------------
    def _receive(self) -> None:
        partial = {ray_bridge.STDOUT: b"", ray_bridge.STDERR: b""}
        held = ""
        while True:
            try:
                kind, payload = ray_bridge.recv_frame(self.link.sock)
            except (OSError, ConnectionError, struct.error) as exc:
                held = self._flush(partial, held)
                if self._killed_at is None:
                    self.lost = NodeLost(f"the connection to the node's agent broke ({exc})")
                self._finish(LOST_EXIT if self.lost is not None else -signal.SIGKILL)
                return
            self.last_heard = time.time()
            if kind in partial:
                *lines, partial[kind] = (partial[kind] + payload).split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace") + "\n"
                    if kind == ray_bridge.STDERR:  # what a heartbeat ended goes on with the next line
                        held = self._relay_line(text, True, held)
                    else:
                        self._relay_line(text, False)
            elif kind == ray_bridge.LOST:
                self.lost = NodeLost(payload.decode(errors="replace"))
                self._flush(partial, held)
                self._finish(LOST_EXIT)
                return
            elif kind == ray_bridge.EXIT:
                self._flush(partial, held)
                self._finish(int(payload))
                return

    def _flush(self, partial: dict[bytes, bytes], held: str) -> str:
        """Relay what is left of each stream without its newline (the agent's last words)."""
        for kind, rest in partial.items():
            if rest:
                self._relay_line(rest.decode(errors="replace"), kind == ray_bridge.STDERR, held)
            partial[kind] = b""
        if held:
            self._write(held, True)
        return ""

    def _finish(self, code: int) -> None:
        self._end(code)
        with contextlib.suppress(OSError):
            self.link.sock.close()

    # --- liveness and ending ---------------------------------------------------------------------
    def beat(self) -> None:
        if self._code is None:
            self.link.beat()

    def stop(self) -> None:
        if self._code is None:
            self.link.stop()

    def forward_signal(self, signum: int) -> bool:
        return self._code is None and self.link.forward(signum)

    def request(self, line: bytes) -> bool:
        return self._code is None and self.link.request(line)

    def kill_ranks(self) -> None:
        if self._code is None:
            self.link.kill()

    def kill(self) -> None:
        """SIGKILL to the agent's processes through the bridge; a group that has not ended
        :data:`~ringtrain.launch.ray.group.KILL_WAIT_S` s after is given up here (its bridge
        unreachable: nothing more will come from it)."""
        if self._code is not None:
            return
        now = time.monotonic()
        if self._killed_at is None:
            self._killed_at = now
            self.link.send_frame(ray_bridge.KILL)
        elif now - self._killed_at > KILL_WAIT_S:
            with contextlib.suppress(OSError):
                self.link.sock.shutdown(socket.SHUT_RDWR)  # the receiving thread ends the group

    def describe_end(self, what: str) -> str:
        if self.lost is None:
            return super().describe_end(what)
        return (f"lost Ray node {self.node.get('node_ip', '?')} (host {self.host}, node id "
                f"{self.node.get('node_id', '?')[:12]}) with {self.ranks_text()} of the job: {what} ended "
                f"with it ({self.lost}). HINT: look for that node's end (ray stop, out of memory, host "
                "down) in Ray's logs there")


__all__ = ["BridgeEnd", "BridgedRayGroup", "NodeLost"]
