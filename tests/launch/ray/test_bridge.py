"""A Ray node's bridge, without Ray: the test plays the driver (a listener, the handshake, frames) and
a ``sleep`` process plays the node's raylet.

Through Ray (the actor that starts it, a lost node) it is tested in tests/launch/ray/test_driver.py and
tests/integration/test_ray_two_hosts.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ringtrain.launch.ray import bridge as ray_bridge
from tests.integration.system import wait_for
from tests.processes import alive

TOKEN = "t" * 64
#: A stand-in agent: says the secret line it got, echoes the link's lines on stdout, beats on stderr,
#: and ends at end-of-file with status 7.
AGENT = """
import sys
print(f"secret {sys.stdin.readline().strip()}", flush=True)
for line in sys.stdin:
    print(f"heard {line.strip()}", flush=True)
    print("@@RINGTRAIN_ALIVE@@", file=sys.stderr, flush=True)
sys.stdout.write("no newline at the end")
raise SystemExit(7)
"""


@dataclass
class Heard:
    """What the test's driver received from the bridge."""

    pid: int = 0
    out: bytes = b""
    err: bytes = b""
    lost: str = ""
    code: int | None = None
    kinds: list[bytes] = field(default_factory=list)


def receive(sock: socket.socket, heard: Heard, until: bytes | None = None, text: bytes = b"") -> Heard:
    """Frames into ``heard`` until one of kind ``until`` (or ``text`` in the stdout) arrives."""
    while True:
        kind, payload = ray_bridge.recv_frame(sock)
        heard.kinds.append(kind)
        if kind == ray_bridge.PID:
            heard.pid = int(payload)
        elif kind == ray_bridge.STDOUT:
            heard.out += payload
        elif kind == ray_bridge.STDERR:
            heard.err += payload
        elif kind == ray_bridge.LOST:
            heard.lost = payload.decode()
        elif kind == ray_bridge.EXIT:
            heard.code = int(payload)
        if kind == until or (text and text in heard.out):
            return heard


@dataclass
class Started:
    sock: socket.socket
    bridge_pid: int
    raylet: subprocess.Popen[bytes]
    heard: Heard


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator[Started]:
    raylet = subprocess.Popen(["sleep", "600"])
    with socket.create_server(("127.0.0.1", 0)) as listener:
        order = {"argv": ["/no/such/python", "-c", AGENT], "env": dict(os.environ), "cwd": str(tmp_path),
                 "secret": "s3cret", "token": TOKEN, "driver_host": "127.0.0.1",
                 "driver_port": listener.getsockname()[1], "node": 1, "raylet_pid": raylet.pid}
        said = subprocess.run([sys.executable, "-m", "ringtrain.launch.ray.bridge"], capture_output=True,
                              input=json.dumps(order).encode() + b"\n", timeout=60, check=True).stdout
        bridge_pid = int(said)
        listener.settimeout(60)
        sock, _ = listener.accept()
    sock.settimeout(60)
    started = Started(sock, bridge_pid, raylet, Heard())
    try:
        assert ray_bridge.check_bridge(sock, TOKEN, 1)
        receive(sock, started.heard, until=ray_bridge.PID)
        yield started
    finally:
        sock.close()
        for pid in (started.heard.pid, bridge_pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        raylet.kill()
        raylet.wait()


@pytest.mark.slow
def test_the_bridge_detaches_starts_the_agent_and_carries_the_link_both_ways(bridge):
    # detached: the command that started it has ended, the bridge runs on in a session of its own
    assert alive(bridge.bridge_pid)
    assert os.getsid(bridge.bridge_pid) == bridge.bridge_pid
    heard = receive(bridge.sock, bridge.heard, text=b"secret s3cret\n")  # the secret: the agent's first line
    beat, stop = ray_bridge.frame(ray_bridge.STDIN, b"\n"), ray_bridge.frame(ray_bridge.STDIN, b"stop\n")
    bridge.sock.sendall(beat + stop)
    receive(bridge.sock, heard, text=b"heard stop\n")
    bridge.sock.sendall(ray_bridge.frame(ray_bridge.CLOSE))  # end-of-file on the agent's stdin
    receive(bridge.sock, heard, until=ray_bridge.EXIT)
    assert heard.out == b"secret s3cret\nheard \nheard stop\nno newline at the end"
    assert heard.err.count(b"@@RINGTRAIN_ALIVE@@\n") == 2
    assert heard.code == 7
    assert heard.kinds[0] == ray_bridge.PID
    assert heard.kinds[-1] == ray_bridge.EXIT
    assert bridge.sock.recv(1) == b""  # then the bridge closes the connection and ends
    wait_for(lambda: not alive(bridge.bridge_pid), 60, "the bridge's end")


@pytest.mark.slow
def test_the_raylets_end_is_told_to_the_driver_and_stops_the_agent(bridge):
    receive(bridge.sock, bridge.heard, text=b"secret s3cret\n")
    bridge.raylet.kill()
    bridge.raylet.wait()
    heard = receive(bridge.sock, bridge.heard, until=ray_bridge.LOST)
    assert heard.lost == f"its raylet (pid {bridge.raylet.pid}) ended: the Ray node is gone"
    receive(bridge.sock, heard, until=ray_bridge.EXIT)
    assert heard.code == 7  # its stdin closed: the agent stopped as at the driver's end-of-file
    wait_for(lambda: not alive(bridge.bridge_pid), 60, "the bridge's end")


@pytest.mark.slow
def test_a_driver_that_goes_away_stops_the_agent_and_the_bridge(bridge):
    receive(bridge.sock, bridge.heard, text=b"secret s3cret\n")
    agent = bridge.heard.pid
    bridge.sock.close()
    wait_for(lambda: not alive(agent) and not alive(bridge.bridge_pid), 60,
             "the agent's and the bridge's end")


@pytest.mark.slow
def test_a_kill_frame_kills_the_agents_processes(bridge):
    bridge.sock.sendall(ray_bridge.frame(ray_bridge.KILL))
    heard = receive(bridge.sock, bridge.heard, until=ray_bridge.EXIT)
    assert heard.code == -signal.SIGKILL


def test_the_handshake_admits_only_the_token_of_this_node():
    def attempt(client_token: str, client_node: int) -> tuple[bool, BaseException | None]:
        server, client = socket.socketpair()
        failure: list[BaseException] = []

        def prove() -> None:
            try:
                ray_bridge.prove_to_driver(client, client_token, client_node)
            except (ConnectionError, OSError) as exc:
                failure.append(exc)

        import threading

        thread = threading.Thread(target=prove)
        thread.start()
        admitted = ray_bridge.check_bridge(server, TOKEN, 1)
        server.close()  # a refused bridge hears nothing back
        thread.join()
        client.close()
        return admitted, failure[0] if failure else None

    assert attempt(TOKEN, 1) == (True, None)
    admitted, failure = attempt("u" * 64, 1)
    assert not admitted
    assert isinstance(failure, ConnectionError)
    admitted, failure = attempt(TOKEN, 2)  # the right token, claimed for another node
    assert not admitted
    assert isinstance(failure, ConnectionError)


def test_frames_longer_than_the_limit_are_refused():
    server, client = socket.socketpair()
    with server, client:
        client.sendall(ray_bridge.HEAD.pack(ray_bridge.STDOUT, ray_bridge.MAX_PAYLOAD + 1))
        with pytest.raises(ConnectionError, match="not a ringtrain bridge"):
            ray_bridge.recv_frame(server)


@pytest.mark.slow
def test_the_bridge_module_imports_no_torch():
    """It runs beside the ranks for the whole job: torch would cost seconds and memory for nothing."""
    code = "import sys, ringtrain.launch.ray.bridge; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
