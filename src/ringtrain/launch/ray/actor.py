"""The Ray actor of ``ringtrain run --ray``: it starts one node's agent, as its child or behind a bridge.

Two ways, one per driver. The fixed-size driver (:mod:`ringtrain.launch.ray.driver`) has the actor
start the agent behind a bridge of its own (:meth:`NodeAgentActor.start_bridge`,
:mod:`ringtrain.launch.ray.bridge`) and then ends the actor; its side is
:class:`ringtrain.launch.ray.bridged_group.BridgedRayGroup`. The elastic driver
(:mod:`ringtrain.launch.ray.elastic`) keeps each worker's actor for the worker's life, the worker its
child and its pipes held here (:meth:`NodeAgentActor.start`); its side is
:class:`ringtrain.launch.ray.group.RayGroup`.

Kept apart from :mod:`ringtrain.launch.places` (whose modules import torch through the job store):
every bundle of the job's placement group starts one of these actors, and each imports this module
first, so it imports nothing but the standard library (Ray and the port helper where used).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO, Any

#: Seconds the driver waits before it asks an actor that Ray calls unavailable again.
FETCH_WAIT_S = 0.5
#: Seconds one output fetch waits for lines before it returns empty: longer than the agent's heartbeat
#: (a line every quarter of RINGTRAIN_PEER_TIMEOUT_SECONDS on Ray, 5 s by default), so that a quiet job
#: costs one round trip a beat. Lines and the agent's end return the fetch at once; a dead actor fails it.
OUTPUT_WAIT_S = 30.0
#: Variables of the actor's own environment that the agent does not inherit: Ray sets
#: OMP_NUM_THREADS to the actor's CPUs, which would change the ranks' threads from `ringtrain run`'s;
#: the others are Ray's for its worker process itself (a rank is none), the niceness one ours (below).
RAY_ONLY_VARIABLES = ("OMP_NUM_THREADS", "RAY_worker_niceness", "RAY_JOB_ID", "RAY_RAYLET_PID")
#: Variables of the actors' Ray runtime environment. Ray runs its workers at niceness 15 (its
#: worker_niceness), and the agent and its ranks would inherit it: ranks at 15 lose the CPU to every
#: process at 0 (Ray's daemons, the driver, anyone else's work), measured as the main cost of --ray
#: against a plain `ringtrain run`. 0 leaves the raylet's own niceness, as Ray's job supervisor does
#: for the job's driver.
ACTOR_ENV_VARS = {"RAY_worker_niceness": "0"}
#: Calls a driver and the agent's output relay may have open on one actor at once.
ACTOR_CONCURRENCY = 4


def agent_actor(num_cpus: float, num_gpus: float, scheduling_strategy: Any = None) -> Any:
    """The Ray actor class of one node's agent, with the options every such actor needs: its threaded
    calls (:data:`ACTOR_CONCURRENCY`), its runtime environment (:data:`ACTOR_ENV_VARS`: the agent and
    its ranks at the raylet's niceness, not Ray's worker niceness) and the CPUs and GPUs it holds, placed
    by ``scheduling_strategy`` (a bundle of a placement group, or a node). ``.remote()`` starts one.
    Every driver of ``ringtrain run --ray`` (fixed-size and elastic) starts its actors from here."""
    import ray

    return ray.remote(NodeAgentActor).options(
        num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=ACTOR_CONCURRENCY,
        runtime_env={"env_vars": dict(ACTOR_ENV_VARS)}, scheduling_strategy=scheduling_strategy)


def agent_environment(environ: Mapping[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """The agent's variables: the actor's ``environ`` less Ray's own for its worker (and Ray's debugger
    as ``breakpoint()``, which would make a rank's breakpoint wait for `ray debug`), ``env`` on top."""
    environment = {k: v for k, v in environ.items() if k not in RAY_ONLY_VARIABLES
                   and not (k == "PYTHONBREAKPOINT" and v.startswith("ray."))}
    environment.update({str(k): str(v) for k, v in env.items()})
    return environment


class NodeAgentActor:
    """Runs in a Ray actor (``ray.remote(NodeAgentActor)``, threaded): one node's agent as its child.

    Every bundle of the job's placement group gets one at first (its :meth:`where` tells the driver
    which node the bundle went to); the first actor of each node runs that node's agent
    (:meth:`start`) and the others end (the placement group itself keeps their bundles reserved).
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

        from ringtrain.launch.ray.bridge import start_agent

        # the link's first line (as store_host.send_secret writes it, which would import torch here)
        value = (ray.get(secret[0]) if secret else None) or ""
        self.proc = start_agent(argv, agent_environment(os.environ, env), value, cwd)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.set_blocking(self.proc.stdin.fileno(), False)  # type: ignore[union-attr]
        self.readers = [threading.Thread(target=self._read, args=(stream, is_err), daemon=True)
                        for stream, is_err in ((self.proc.stdout, False), (self.proc.stderr, True))]
        for reader in self.readers:
            reader.start()
        threading.Thread(target=self._wait, daemon=True).start()
        return self.proc.pid

    def start_bridge(self, argv: Sequence[str], env: Mapping[str, str], secret: Sequence[Any],
                     cwd: str | None, driver: Sequence[Any], node: int, token: Sequence[Any]) -> int:
        """Start the node's agent behind a bridge of its own (:mod:`ringtrain.launch.ray.bridge`) that
        outlives this actor: it connects to the driver at ``driver`` (host, port) as node ``node``,
        proving ``token`` (a one-element list holding an object reference, as ``secret``), and watches
        this node's raylet. ``argv``, ``env``, ``secret`` and ``cwd`` as :meth:`start`. Returns the
        bridge's pid once it runs on its own (the driver may end this actor then)."""
        import json

        import ray

        order = {"argv": list(argv), "env": agent_environment(os.environ, env), "cwd": cwd,
                 "secret": (ray.get(secret[0]) if secret else None) or "", "token": ray.get(token[0]),
                 "driver_host": str(driver[0]), "driver_port": int(driver[1]), "node": int(node),
                 # the raylet started this worker process: its pid is in Ray's variable, or our parent's
                 "raylet_pid": int(os.environ.get("RAY_RAYLET_PID") or os.getppid())}
        bridge = subprocess.Popen([sys.executable, "-m", "ringtrain.launch.ray.bridge"],
                                  env=agent_environment(os.environ, {}), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, start_new_session=True)
        out, _ = bridge.communicate(json.dumps(order).encode() + b"\n", timeout=60)
        if bridge.returncode != 0 or not out.strip().isdigit():
            raise RuntimeError(f"the node's bridge did not start (exit status {bridge.returncode}, said "
                               f"{out.decode(errors='replace').strip()!r})")
        return int(out)

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

    def output(self, wait_s: float = OUTPUT_WAIT_S) -> tuple[list[tuple[bool, str]], int | None]:
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
