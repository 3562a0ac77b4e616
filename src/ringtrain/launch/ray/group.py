"""A group of ranks on one Ray node: a Ray actor there runs the node's agent (an elastic worker) as its
child process, for as long as it runs.

The elastic ``ringtrain run --ray --min-np`` (:mod:`ringtrain.launch.ray.elastic`) starts one
:class:`~ringtrain.launch.ray.actor.NodeAgentActor` per worker. The actor starts the command
(``python -m ringtrain.launch.elastic_worker ...``) as a child process, so the ranks are ordinary
processes and never import Ray. The actor holds the child's pipes: it writes what the driver sends (the
secret, heartbeats, stop and kill requests of :mod:`ringtrain.launch.link`) on the child's stdin, and
keeps its output lines until the driver fetches them (:meth:`NodeAgentActor.output`, a call that waits
for lines, so output arrives as it is written without a busy loop). The fixed-size ``--ray`` job's
agents run behind bridges instead, without their actors (:mod:`ringtrain.launch.ray.bridged_group`,
which builds on this class).

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
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, ClassVar

from ringtrain.launch.link import KILL_REQUEST, STOP_REQUEST
from ringtrain.launch.ray.actor import FETCH_WAIT_S, NodeAgentActor
from ringtrain.launch.supervision import Reach, RelayedGroup

#: The exit status of a group whose actor died (its process or its node lost): no status came back.
LOST_EXIT = 255
#: Seconds an actor may stay "unavailable" to Ray before its group counts as lost (Ray says so at
#: once when the connection to the actor breaks; a node that is gone stays so).
UNAVAILABLE_GRACE_S = 3.0
#: Seconds a killed group's actor gets to end before Ray kills it (and as long again before the
#: driver stops waiting for Ray's word).
KILL_WAIT_S = 5.0


class RayGroup(RelayedGroup):
    """The driver's side of one node's agent in a :class:`NodeAgentActor` (see the module doc).

    ``actor``: the actor's handle; ``argv``: the agent's command line; ``env``: variables sent along
    (as the ssh place sends them); ``secret_ref``: the job's secret as a Ray object reference;
    ``ranks``: the global ranks of this node; ``node``: the actor's :meth:`~NodeAgentActor.where`.
    ``start_timeout``: None (the default) raises Ray's error when the agent does not start; seconds
    make a group that could not start within them (its node full or gone) one that ended at once
    with :data:`LOST_EXIT`, :meth:`unreachable` and said so by :meth:`describe_end` (the elastic
    driver's workers, whose failures to start are the driver's to count).
    """

    kind: ClassVar[str] = "ray"
    #: Ray's error when the actor died (its node lost, its process killed), else None.
    lost: BaseException | None

    def __init__(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 actor: Any, node: Mapping[str, str], ranks: range, secret_ref: Any = None,
                 reach: Reach | None = None, talks: bool = True, lock: threading.Lock | None = None,
                 on_error_line: Callable[[str], bool] | None = None,
                 out: IO[str] | None = None, err: IO[str] | None = None,
                 start_timeout: float | None = None) -> None:
        import ray

        super().__init__(host, lock=lock, on_error_line=on_error_line, out=out, err=err)
        self._init_state(actor, node, ranks)
        cwd = (reach or Reach()).cwd or os.getcwd()
        started = actor.start.remote(list(argv), dict(env or {}),
                                     [secret_ref] if secret_ref is not None else [], cwd)
        try:
            self._pid = int(ray.get(started, timeout=start_timeout))
        except Exception as exc:
            if start_timeout is None:
                raise
            self._pid, self.lost, self.not_started = 0, exc, True
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            self._relay = threading.Thread(target=self._end, args=(LOST_EXIT,), daemon=True)
            self._relay.start()
            self._relay.join()
            return
        self._relay = threading.Thread(target=self._fetch, name=f"ringtrain-ray-relay-{host}", daemon=True)
        self._relay.start()

    def _init_state(self, actor: Any, node: Mapping[str, str], ranks: range) -> None:
        """What every Ray node's group keeps: its actor, node and ranks, its end, and what was lost."""
        self.actor = actor
        self.node = dict(node)
        self.ranks = ranks
        self._code: int | None = None
        self._pid = 0
        self.lost = None
        #: When the driver last heard from the actor (wall-clock): a lost node went after this.
        self.last_heard = time.time()
        self._stopping = False
        #: When :meth:`kill` was first called (monotonic), and whether Ray was asked to kill the actor.
        self._killed_at: float | None = None
        self._ray_killed = False
        #: Whether the agent never started (see ``start_timeout``).
        self.not_started = False
        #: Whether the actor was killed after the agent ended, to free its resources (the elastic driver).
        self.freed = False

    # --- output ----------------------------------------------------------------------------------
    def _fetch(self) -> None:
        import ray
        from ray.exceptions import ActorUnavailableError

        held, failing_since = "", None
        while True:
            try:
                lines, code = ray.get(self.actor.output.remote())
            except Exception as exc:  # Ray's actor errors: the node or the process went
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
                if is_err:  # what a heartbeat ended on stderr goes on with the next stderr line
                    held = self._relay_line(line, True, held)
                else:
                    self._relay_line(line, False)
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
        except Exception:  # the cluster itself may be gone
            return True

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
        """The agent could not be started on its node (only with ``start_timeout``)."""
        return self.not_started

    def lost_contact(self) -> bool:
        return self.lost is not None

    def ranks_text(self) -> str:
        """This node's ranks in words: "rank 3", "ranks 2-3"."""
        first, last = self.ranks[0], self.ranks[-1]
        return f"rank {first}" if first == last else f"ranks {first}-{last}"

    def describe_end(self, what: str) -> str:
        """A lost actor names its Ray node and the ranks that were on it."""
        if self.lost is None:
            return super().describe_end(what)
        ranks = self.ranks_text()
        reason = (str(self.lost).strip().splitlines() or [type(self.lost).__name__])[0]
        if self.not_started:
            return (f"{what} could not start on Ray node {self.node.get('node_ip', '?')} (host {self.host}) "
                    f"as {ranks}: its actor did not start ({type(self.lost).__name__}: {reason}). HINT: the "
                    "node may be full (other jobs' actors) or gone; see `ray status`")
        return (f"lost Ray node {self.node.get('node_ip', '?')} (host {self.host}, node id "
                f"{self.node.get('node_id', '?')[:12]}) with {ranks} of the job: {what} died with its actor "
                f"({type(self.lost).__name__}: {reason}). HINT: look for that node's end (ray stop, out of "
                "memory, host down) in Ray's logs there")


__all__ = ["LOST_EXIT", "NodeAgentActor", "RayGroup"]
