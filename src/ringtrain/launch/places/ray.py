"""A group of ranks on one Ray node: a Ray actor there runs the node's agent as its child process.

``ringtrain run --ray`` (:mod:`ringtrain.launch.ray_driver`) places one :class:`NodeAgentActor` per
Ray node. The actor starts the same agent the ssh place starts (``python -m
ringtrain.launch.node_entry CONFIG_JSON``) as a child process, so the ranks are ordinary processes of
that agent and never import Ray. The actor holds the child's pipes: it writes what the driver sends
(the secret, heartbeats, stop and kill requests of :mod:`ringtrain.launch.link`) on the child's stdin,
and keeps its output lines until the driver fetches them (:meth:`NodeAgentActor.output`, a call that
waits for lines, so output arrives as it is written without a busy loop).

:class:`RayGroup` is the driver's side, a :class:`~ringtrain.launch.supervision.RankGroup`: a thread
fetches the output and relays it as a ``ProcessGroup`` relays a child's pipes. When the actor dies
(its process killed, its node lost) the pending fetch fails with Ray's actor error; the group then
ends with :data:`LOST_EXIT` and says which node and ranks went.

Ray is imported where it is used: this module loads without the ``ray`` extra.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, ClassVar

from ringtrain.launch.link import ALIVE_LINE, KILL_REQUEST, STOP_REQUEST
from ringtrain.launch.store_host import send_secret
from ringtrain.launch.supervision import TAIL_LINES, RankGroup, Reach

#: The exit status of a group whose actor died (its process or its node lost): no status came back.
LOST_EXIT = 255
#: Seconds one output fetch waits for lines before it returns empty (a heartbeat arrives each second).
FETCH_WAIT_S = 0.5
#: Seconds an actor may stay "unavailable" to Ray before its group counts as lost (Ray says so at
#: once when the connection to the actor breaks; a node that is gone stays so).
UNAVAILABLE_GRACE_S = 3.0
#: Seconds a killed group's actor gets to end before Ray kills it (and as long again before the
#: driver stops waiting for Ray's word).
KILL_WAIT_S = 5.0
#: Variables of the actor's own environment that the agent does not inherit: Ray sets
#: OMP_NUM_THREADS to the actor's CPUs, which would change the ranks' threads from `ringtrain run`'s.
RAY_ONLY_VARIABLES = ("OMP_NUM_THREADS",)


class NodeAgentActor:
    """Runs in a Ray actor (``ray.remote(NodeAgentActor)``, threaded): one node's agent as its child.

    Also a seat-holder: every bundle of the job's placement group gets one such actor, so that the
    bundle's CPUs and GPUs stay reserved; the first actor of each node runs the agent (:meth:`start`).
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: deque[tuple[bool, str]] = deque()
        self.changed = threading.Condition()
        self.readers: list[threading.Thread] = []
        self.code: int | None = None

    def where(self) -> dict[str, str]:
        """The Ray node this actor runs on: its id, IP address and host name."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname()}

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray gave this actor."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def free_port(self) -> int:
        """A TCP port free on this node now (node 0's: where the job's store will listen)."""
        from ringtrain.engine.netutil import free_port

        return free_port()

    def start(self, argv: Sequence[str], env: Mapping[str, str], secret: Sequence[Any],
              cwd: str | None = None) -> int:
        """Start the agent: ``argv`` with this actor's interpreter as ``argv[0]`` (the one that imported
        ringtrain here), in this actor's environment with ``env`` on top, in the folder ``cwd`` (the
        driver's, as the ssh place does; this actor's own where this node has no such folder); the
        job's secret (``secret``: a one-element list holding an object reference, so that it never
        shows in Ray's task listings) becomes the first line of its stdin. Returns the agent's pid."""
        import ray

        environment = {k: v for k, v in os.environ.items() if k not in RAY_ONLY_VARIABLES}
        environment.update({str(k): str(v) for k, v in env.items()})
        pipe = subprocess.PIPE
        self.proc = subprocess.Popen([sys.executable, *list(argv)[1:]], env=environment, stdin=pipe,
                                     stdout=pipe, stderr=pipe, start_new_session=True,
                                     cwd=cwd if cwd and os.path.isdir(cwd) else None)
        send_secret(self.proc.stdin, ray.get(secret[0]) if secret else None)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.set_blocking(self.proc.stdin.fileno(), False)  # type: ignore[union-attr]
        self.readers = [threading.Thread(target=self._read, args=(stream, is_err), daemon=True)
                        for stream, is_err in ((self.proc.stdout, False), (self.proc.stderr, True))]
        for reader in self.readers:
            reader.start()
        threading.Thread(target=self._wait, daemon=True).start()
        return self.proc.pid

    def _read(self, stream: IO[bytes], is_err: bool) -> None:
        for raw in iter(stream.readline, b""):
            with self.changed:
                self.lines.append((is_err, raw.decode(errors="replace")))
                self.changed.notify_all()

    def _wait(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        for reader in self.readers:  # every line is taken before the end is told
            reader.join()
        with self.changed:
            self.code = code
            self.changed.notify_all()

    def output(self, wait_s: float = FETCH_WAIT_S) -> tuple[list[tuple[bool, str]], int | None]:
        """The agent's lines since the last call, as (is_stderr, line); and its exit status once it
        ended and every line was taken. Waits up to ``wait_s`` for something to say."""
        with self.changed:
            self.changed.wait_for(lambda: self.lines or self.code is not None, timeout=wait_s)
            lines = list(self.lines)
            self.lines.clear()
            return lines, self.code if not lines else None

    def send(self, data: bytes) -> bool:
        """Write ``data`` on the agent's stdin; False where it could not be written whole (a full pipe
        skips a heartbeat rather than block)."""
        try:
            return os.write(self.proc.stdin.fileno(), data) == len(data)  # type: ignore[union-attr]
        except (OSError, ValueError, AttributeError):
            return False

    def close_stdin(self) -> None:
        """End-of-file on the agent's stdin: "stop" in the link's words."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def kill(self) -> None:
        """SIGKILL to the agent's process group (its ranks learn that their agent died and end)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class RayGroup(RankGroup):
    """The driver's side of one node's agent in a :class:`NodeAgentActor` (see the module doc).

    ``actor``: the actor's handle; ``argv``: the agent's command line; ``env``: variables sent along
    (as the ssh place sends them); ``secret_ref``: the job's secret as a Ray object reference;
    ``ranks``: the global ranks of this node; ``node``: the actor's :meth:`~NodeAgentActor.where`.
    """

    kind: ClassVar[str] = "ray"

    def __init__(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 actor: Any, node: Mapping[str, str], ranks: range, secret_ref: Any = None,
                 reach: Reach | None = None, talks: bool = True, lock: threading.Lock | None = None,
                 on_error_line: Callable[[str], bool] | None = None,
                 out: IO[str] | None = None, err: IO[str] | None = None) -> None:
        import ray

        self.host = host
        self.tail = []
        self.ended_at = None
        self.actor = actor
        self.node = dict(node)
        self.ranks = ranks
        self.lock = lock or threading.Lock()
        self._on_error_line = on_error_line
        self._out, self._err = out or sys.stdout, err or sys.stderr
        self._code: int | None = None
        #: Ray's error when the actor died (its node lost, its process killed), else None.
        self.lost: BaseException | None = None
        #: When the driver last heard from the actor (wall-clock): a lost node went after this.
        self.last_heard = time.time()
        self._heard_beat: float | None = None
        self._silent_for: float | None = None
        self._stopping = False
        #: When :meth:`kill` was first called (monotonic), and whether Ray was asked to kill the actor.
        self._killed_at: float | None = None
        self._ray_killed = False
        cwd = (reach or Reach()).cwd or os.getcwd()
        self._pid = int(ray.get(actor.start.remote(list(argv), dict(env or {}),
                                                   [secret_ref] if secret_ref is not None else [], cwd)))
        self._relay = threading.Thread(target=self._fetch, name=f"ringtrain-ray-relay-{host}", daemon=True)
        self._relay.start()

    # --- output ----------------------------------------------------------------------------------
    def _fetch(self) -> None:
        import ray
        from ray.exceptions import ActorUnavailableError

        held, failing_since = "", None
        while True:
            try:
                lines, code = ray.get(self.actor.output.remote())
            except Exception as exc:  # noqa: BLE001 - Ray's actor errors: the node or the process went
                # "unavailable" may pass (a blip of the network): asked again for a few seconds first
                failing_since = failing_since or time.monotonic()
                if isinstance(exc, ActorUnavailableError) and self._killed_at is None \
                        and time.monotonic() - failing_since < UNAVAILABLE_GRACE_S:
                    time.sleep(FETCH_WAIT_S)
                    continue
                if self._killed_at is None or not self._node_alive():
                    self.lost = exc
                self._end(LOST_EXIT if self.lost is not None else -signal.SIGKILL)
                return
            failing_since = None
            self.last_heard = time.time()
            for is_err, line in lines:
                if is_err:
                    line, held = held + line, ""
                    if line.endswith(ALIVE_LINE + "\n") or line.endswith(ALIVE_LINE):
                        held = line[: line.rindex(ALIVE_LINE)]
                        self._heard_beat = time.monotonic()
                        continue
                    if self._on_error_line is not None and self._on_error_line(line):
                        continue
                self._write(line, is_err)
            if code is not None:
                if held:
                    self._write(held, True)
                self._end(code)
                return

    def _node_alive(self) -> bool:
        """Whether Ray still counts this group's node among the living (True where it cannot tell)."""
        import ray

        try:
            return any(n.get("NodeID") == self.node.get("node_id") and n.get("Alive") for n in ray.nodes())
        except Exception:  # noqa: BLE001 - the cluster itself may be gone
            return True

    def _write(self, line: str, is_err: bool) -> None:
        with self.lock:
            if is_err:
                self.tail = (self.tail + [line])[-TAIL_LINES:]
            dest = self._err if is_err else self._out
            dest.write(line)
            dest.flush()

    def _end(self, code: int) -> None:
        self.ended_at = time.time()
        self._code = code

    def join_output(self, timeout: float) -> None:
        self._relay.join(timeout=timeout)

    # --- status ----------------------------------------------------------------------------------
    def poll(self) -> int | None:
        return self._code

    @property
    def pid(self) -> int:
        """The agent's pid on its Ray node."""
        return self._pid

    def wait(self, timeout: float | None = None) -> int:
        self._relay.join(timeout=timeout)
        if self._code is None:
            raise subprocess.TimeoutExpired(f"ray node agent on {self.host}", timeout or 0.0)
        return self._code

    # --- liveness --------------------------------------------------------------------------------
    def beat(self) -> None:
        if not self._stopping and self._code is None:
            self.actor.send.remote(b"\n")  # not awaited: a dead actor's error is the relay's to see

    def check_silence(self, limit: float) -> bool:
        if self._code is not None or self._heard_beat is None or self._silent_for is not None:
            return False
        silent = time.monotonic() - self._heard_beat
        if silent <= limit:
            return False
        self._silent_for = silent
        return True

    @property
    def silent_for(self) -> float | None:
        return self._silent_for

    # --- ending ----------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True
        if self._code is None:
            self.actor.send.remote(STOP_REQUEST + b"\n")

    def kill_ranks(self) -> None:
        self._stopping = True
        if self._code is None:
            self.actor.send.remote(KILL_REQUEST + b"\n")
            self.actor.close_stdin.remote()

    def kill(self) -> None:
        """SIGKILL to the agent's processes through the actor; an actor that does not end within
        :data:`KILL_WAIT_S` is killed by Ray, and after as long again the group is given up here."""
        import ray

        if self._code is not None:
            return
        now = time.monotonic()
        if self._killed_at is None:
            self._killed_at = now
            self.actor.kill.remote()
        elif now - self._killed_at > 2 * KILL_WAIT_S:
            self._end(-signal.SIGKILL)  # Ray never told: nothing more will come from it
        elif now - self._killed_at > KILL_WAIT_S and not self._ray_killed:
            self._ray_killed = True
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)

    def unreachable(self) -> bool:
        return self.lost is not None

    def lost_contact(self) -> bool:
        return self.lost is not None

    def describe_end(self, what: str) -> str:
        """A lost actor names its Ray node and the ranks that were on it."""
        if self.lost is None:
            return super().describe_end(what)
        first, last = self.ranks[0], self.ranks[-1]
        ranks = f"rank {first}" if first == last else f"ranks {first}-{last}"
        reason = (str(self.lost).strip().splitlines() or [type(self.lost).__name__])[0]
        return (f"lost Ray node {self.node.get('node_ip', '?')} (host {self.host}, node id "
                f"{self.node.get('node_id', '?')[:12]}) with {ranks} of the job: {what} died with its actor "
                f"({type(self.lost).__name__}: {reason}). HINT: look for that node's end (ray stop, out of "
                "memory, host down) in Ray's logs there")
