"""ringtrain's rendezvous for torch's elastic agent: fixed membership, one namespace per attempt, checked.

torch's ``static`` handler keeps one TCPStore for every attempt and hands the workers its address,
so after a restart the workers read the keys of the dead attempt; nodes that were started with
different settings only find out when a 120 s timeout ends. This handler (backend ``"ringtrain"``,
used by ``ringtrain run`` wherever it would have used ``static``) fixes both:

* The node agents meet on the job's key-value store (:mod:`ringtrain.engine.job_store`, hosted by
  node 0's agent; see :mod:`ringtrain.launch.store_host`). Every call of :meth:`next_rendezvous`
  is a new *round* with keys of its own (``rdzv/round<k>/...``), and the store it returns to the
  agent is prefixed by run id and round, so nothing of a dead attempt is ever read again.
* Node 0 picks a fresh port for every round and hands it out as ``MASTER_PORT``: the workers'
  rank 0 hosts a new store there each attempt (``use_agent_store`` is False), as DDP scripts expect.
  Round 0 too: torchrun's static rendezvous gives the workers the ``--rdzv-endpoint`` port itself,
  but here that port is the authenticated job store's for the whole job (other nodes and every rank
  connect to it), and a DDP script's store there would be torch's unauthenticated ``TCPStore``
  (docs/launching.md, "The rendezvous port").
* Each node publishes its *view* (``--nnodes``, ranks per node, run id, rendezvous port, ringtrain,
  torch and Python versions, node rank, host). Any difference, or two nodes with one node rank, closes
  the rendezvous with a message that names every difference and node, and every node raises
  :class:`~ringtrain.exceptions.RendezvousMismatchError` with that message within a poll interval.
* :meth:`num_nodes_waiting` counts the nodes already waiting in the next round, so a node that
  restarts its ranks makes torch's agent restart them on every other node too (torchrun's meaning
  of ``--max-restarts``: the whole group restarts). It also ends a running node when the rendezvous
  was closed (a node gave up after its last restart).
* Each agent beats a counter in the store every second while it is in a round or has seen a node
  waiting in the next one; node 0 declares a node missing from a round gone once its counter stops
  for ``node_timeout`` seconds, instead of waiting out the rendezvous timeout.
* Above :data:`FULL_RATE_NODES` nodes the agents' heartbeats and polls stretch with the number of
  nodes (:func:`steady_intervals`), and only node 0 reads the views while a round forms, so node 0's
  store answers about as many requests a second for a thousand nodes as for sixteen.

Rounds stay in step because membership is fixed: no node can start round k+1 before every node
joined round k, and each node's k-th call joins round k. The round is also the attempt number the
workers get (``RINGTRAIN_ATTEMPT``): unlike ``TORCHELASTIC_RESTART_COUNT`` it is the same on every
node (torch's agent does not count a restart caused by another node).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from torch.distributed import DistStoreError, PrefixStore, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

from ringtrain.engine.job_store import JobStore
from ringtrain.engine.netutil import free_port
from ringtrain.exceptions import JobStoreError, RendezvousFailedError, RendezvousMismatchError

#: The name this handler is registered under in torch's rendezvous registry.
BACKEND = "ringtrain"
#: Seconds between two polls of the store while a node waits in a round.
POLL_INTERVAL = 0.2
#: Seconds between two heartbeats of an agent.
BEAT_INTERVAL = 1.0
#: Seconds without a heartbeat after which node 0 declares a missing node gone (``node_timeout``).
NODE_TIMEOUT = 15.0
#: Seconds between two looks at the store for nodes waiting in the next round (torch's agent asks
#: every 0.1 s; the answer in between is the last one read), and for a closed rendezvous.
WAITING_INTERVAL = 0.1
CLOSED_INTERVAL = 1.0
#: Jobs of up to this many nodes poll at the intervals above; larger ones stretch them in proportion,
#: so that node 0's store, which every agent polls while the ranks run, answers about the same number
#: of requests a second at any size (measured: benchmarks/README.md, "The rendezvous at 1,000 nodes").
FULL_RATE_NODES = 12


def steady_intervals(nnodes: int, node_timeout: float = NODE_TIMEOUT) -> tuple[float, float, float]:
    """Seconds between an agent's heartbeats, its looks for waiting nodes and for a closed rendezvous.

    Up to :data:`FULL_RATE_NODES` nodes: :data:`BEAT_INTERVAL`, :data:`WAITING_INTERVAL`,
    :data:`CLOSED_INTERVAL`. Beyond, each grows with the number of nodes; a heartbeat stays at least
    four times as frequent as ``node_timeout`` (which judges it), and the two looks come every
    ``nnodes / 120`` s at most (at 1,000 nodes a restarted node or a closed rendezvous is noticed
    within 8.4 s).
    """
    stretch = max(1.0, nnodes / FULL_RATE_NODES)
    beat = min(BEAT_INTERVAL * stretch, max(BEAT_INTERVAL, node_timeout / 4))
    waiting = WAITING_INTERVAL * stretch
    return beat, waiting, max(CLOSED_INTERVAL, waiting)

_CLOSED = "rdzv/closed"
_CLOSED_SEEN = "rdzv/closed_seen"

#: The fields of a view that every node must share, with the words a user knows them by.
_SHARED_FIELDS = {
    "nnodes": "--nnodes",
    "nproc_per_node": "--nproc-per-node (ranks on each node)",
    "run_id": "--rdzv-id (run id)",
    "port": "rendezvous port (--master-port / --rdzv-endpoint)",
    "ringtrain": "ringtrain version",
    "torch": "torch version",
    "python": "Python version",
}


@dataclass(frozen=True)
class NodeView:
    """What one node was told about the job; every field in ``_SHARED_FIELDS`` must match everywhere."""

    node_rank: int
    nnodes: int
    nproc_per_node: tuple[int, ...]
    """Ranks on every node, in node-rank order."""
    run_id: str
    port: int
    host: str
    pid: int
    ringtrain: str
    torch: str
    python: str

    @classmethod
    def here(cls, node_rank: int, nnodes: int, nproc: int, run_id: str, port: int,
             layout: tuple[int, ...] | None = None, host: str | None = None) -> NodeView:
        """This process's view; ``layout`` is every node's rank count when a driver knows it."""
        import torch

        from ringtrain import __version__

        return cls(node_rank=node_rank, nnodes=nnodes, nproc_per_node=tuple(layout or (nproc,) * nnodes),
                   run_id=run_id, port=port, host=host or socket.gethostname(), pid=os.getpid(),
                   ringtrain=__version__, torch=torch.__version__,
                   python=f"{sys.version_info.major}.{sys.version_info.minor}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> NodeView:
        body = json.loads(text)
        body["nproc_per_node"] = tuple(body["nproc_per_node"])
        return cls(**body)

    def name(self) -> str:
        return f"node {self.node_rank} ({self.host}, pid {self.pid})"


def _shown(field: str, value: Any) -> str:
    if field == "nproc_per_node" and len(set(value)) == 1:
        return str(value[0])
    if field == "nproc_per_node":
        return ",".join(str(v) for v in value)
    return str(value)


def describe_mismatch(views: list[NodeView]) -> str | None:
    """None when the views agree; else one message naming every difference and the nodes on each side."""
    lines = []
    views = sorted(views, key=lambda v: (v.node_rank, v.host, v.pid))  # the same message on every node
    for field, label in _SHARED_FIELDS.items():
        values: dict[str, list[str]] = {}
        for view in views:
            values.setdefault(_shown(field, getattr(view, field)), []).append(view.name())
        if len(values) > 1:
            sides = "; ".join(f"{value} on {', '.join(nodes)}" for value, nodes in values.items())
            lines.append(f"  {label}: {sides}")
    by_rank: dict[int, list[NodeView]] = {}
    for view in views:
        by_rank.setdefault(view.node_rank, []).append(view)
    for rank, same in sorted(by_rank.items()):
        if len(same) > 1:
            lines.append(f"  --node-rank {rank} is claimed by {len(same)} nodes: "
                         f"{', '.join(v.name() for v in same)}")
    if not lines:
        return None
    return ("the nodes of this job disagree at rendezvous:\n" + "\n".join(lines) + "\nHINT: start every node "
            "with the same --nnodes, --nproc-per-node, --master-port and --rdzv-id, a --node-rank of its "
            "own from 0 to --nnodes - 1, and the same ringtrain, torch and Python versions.")


class RingtrainRendezvous(RendezvousHandler):
    """A fixed set of ``view.nnodes`` nodes meeting on a job store; one round per attempt (see module doc).

    ``store`` is a connection to the job store (kept referenced here: torch's C++ side holds it
    without keeping it alive). ``bootstrap_host`` is the address node 0's workers can be reached on
    (``MASTER_ADDR``). ``timeout`` bounds a round in seconds.
    """

    def __init__(self, store: JobStore, view: NodeView, bootstrap_host: str, timeout: float,
                 node_timeout: float = NODE_TIMEOUT) -> None:
        self._store = store
        self.view = view
        self.bootstrap_host = bootstrap_host
        self.timeout = timeout
        self.node_timeout = node_timeout
        #: The round this node is in (-1 before the first rendezvous); the workers' attempt number.
        self.round = -1
        self._ports_used: set[int] = set()
        self._beater: threading.Thread | None = None
        self._stop = threading.Event()
        #: Wakes the heartbeat thread early: a round starts, a node is seen waiting, the handler stops.
        self._nudge = threading.Event()
        #: Whether this node is in a round that has not formed yet (its heartbeat then counts).
        self._in_round = False
        self._last_closed_check = 0.0
        self._last_waiting_check = 0.0
        self._waiting = 0
        intervals = steady_intervals(view.nnodes, node_timeout)
        self._beat_every, self._waiting_every, self._closed_every = intervals
        self._attempt_stores: list[Store] = []
        #: Nodes seen in the current round so far (node 0 waits for them to read a closing reason).
        self.joined = 1

    # --- torch's interface ------------------------------------------------------------------------
    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # The workers' rank 0 hosts their own store on a fresh MASTER_PORT each attempt.
        return False

    def get_run_id(self) -> str:
        return self.view.run_id

    def next_rendezvous(self) -> RendezvousInfo:
        self.round += 1
        self._last_waiting_check, self._waiting = 0.0, 0  # a new round's arrivals are counted afresh
        self._in_round = True
        self._nudge.set()
        try:
            self._start_heartbeat()
            members, bootstrap = self._join(self.round)
        except (JobStoreError, OSError) as exc:
            raise RendezvousFailedError(self._store_gone(exc)) from None
        finally:
            self._in_round = False
        host, _, port = bootstrap.rpartition(":")
        store = PrefixStore(f"run/{self.view.run_id}/attempt{self.round}", self._store)
        self._attempt_stores = [store]  # the agent holds it too; keep ours until the next round
        return RendezvousInfo(store, self.view.node_rank, members, RendezvousStoreInfo(host, int(port)))

    def num_nodes_waiting(self) -> int:
        if self.round < 0:
            return 0
        now = time.monotonic()
        try:
            if now - self._last_waiting_check >= self._waiting_every:
                self._last_waiting_check = now
                waiting = int(self._store.add(f"rdzv/round{self.round + 1}/arrivals", 0))
                if waiting and not self._waiting:
                    self._nudge.set()  # a round is forming: node 0 judges this node by its heartbeat now
                self._waiting = waiting
            if now - self._last_closed_check >= self._closed_every:
                self._last_closed_check = now
                self._raise_if_closed()
        except (JobStoreError, OSError) as exc:
            raise RendezvousFailedError(self._store_gone(exc)) from None
        return self._waiting

    def is_closed(self) -> bool:
        try:
            return self._store.check([_CLOSED])
        except (JobStoreError, OSError):
            return True

    def set_closed(self, reason: str = "the rendezvous was closed") -> None:
        """Close the rendezvous for every node; the first reason given is the one every node reports."""
        with contextlib.suppress(JobStoreError, OSError):
            self._store.compare_set(_CLOSED, "", reason)

    def closed_reason(self) -> str | None:
        """Why the rendezvous was closed, or None while it is open (or the store is gone)."""
        try:
            if self._store.check([_CLOSED]):
                return self._store.get(_CLOSED).decode(errors="replace")
        except (JobStoreError, OSError):
            pass
        return None

    def shutdown(self) -> bool:
        self._stop.set()
        self._nudge.set()
        if self._beater is not None:
            self._beater.join(timeout=5.0)
        return True

    # --- a round ----------------------------------------------------------------------------------
    def _join(self, k: int) -> tuple[int, str]:
        """Join round ``k``; returns (number of nodes, ``host:port`` of the workers' store)."""
        store, me = self._store, self.view
        prefix = f"rdzv/round{k}/"
        self._raise_if_closed()
        if store.check([prefix + "formed"]):
            raise self._too_late(k)
        store.append(prefix + "views", me.to_json() + "\n")
        store.add(prefix + "arrivals", 1)
        deadline = time.monotonic() + self.timeout
        heard: dict[int, tuple[int, float]] = {}  # node rank -> (last heartbeat value, when it changed)
        # Node 0 reads every node's view at each poll (a mismatch closes the rendezvous, which the
        # others read as its reason); the others wait for the round to form and read views only at the
        # deadline: each of N nodes reading all N views at every poll was N² at start-up.
        reads_views = me.node_rank == 0
        poll = max(POLL_INTERVAL, self._waiting_every)
        views: list[NodeView] = []
        while True:
            self._raise_if_closed()
            if reads_views or time.monotonic() > deadline:
                views = [NodeView.from_json(line) for line in
                         store.get(prefix + "views").decode().splitlines() if line.strip()]
                self.joined = len(views)
                problem = describe_mismatch(views)
                if problem is not None:
                    self._close(problem)
                    raise RendezvousMismatchError(problem)
            if store.check([prefix + "formed"]):
                formed = json.loads(store.get(prefix + "formed"))
                if [me.host, me.pid] not in formed["members"]:
                    raise self._too_late(k)
                return len(formed["members"]), formed["bootstrap"]
            ranks = {v.node_rank for v in views}
            if reads_views:
                if ranks == set(range(me.nnodes)):
                    return self._form(k, views)
                self._check_missing(k, sorted(set(range(me.nnodes)) - ranks), heard, views)
            if time.monotonic() > deadline and views:
                missing = sorted(set(range(me.nnodes)) - ranks)
                problem = (f"node(s) {', '.join(map(str, missing))} did not join round {k} of the rendezvous "
                           f"within {self.timeout:g} s (they were never started, cannot reach node 0 at the "
                           "rendezvous address, or are stuck). HINT: start every node with the same "
                           "--master-addr/--master-port, or raise --start-timeout.")
                self._close(problem)
                raise RendezvousFailedError(problem)
            if reads_views:
                time.sleep(POLL_INTERVAL)
            else:
                # back at once when the round forms; a closed rendezvous is looked at each poll
                with contextlib.suppress(DistStoreError):
                    store.wait([prefix + "formed"], datetime.timedelta(seconds=poll))

    def _form(self, k: int, views: list[NodeView]) -> tuple[int, str]:
        port = self._fresh_port()
        bootstrap = f"{self.bootstrap_host}:{port}"
        ordered = sorted(views, key=lambda v: v.node_rank)
        formed = {"bootstrap": bootstrap, "members": [[v.host, v.pid] for v in ordered]}
        self._store.set(f"rdzv/round{k}/formed", json.dumps(formed))
        return len(ordered), bootstrap

    def _fresh_port(self) -> int:
        """A free port on node 0 that no earlier round handed out: never a dead attempt's address."""
        for host in (self.bootstrap_host, ""):  # "": a name of this host we cannot bind (a NAT address)
            with contextlib.suppress(OSError):
                port = free_port(host, avoid=self._ports_used)
                self._ports_used.add(port)
                return port
        raise RendezvousFailedError("no fresh port is free on node 0 for the workers' store. HINT: free some "
                                    "ports (ip_local_port_range) and start again.")

    def _check_missing(self, k: int, missing: list[int], heard: dict[int, tuple[int, float]],
                       views: list[NodeView]) -> None:
        """Node 0: close the rendezvous when a missing node that was alive stops beating."""
        now = time.monotonic()
        for rank in missing:
            key = f"rdzv/alive/{rank}"
            if not self._store.check([key]):
                continue  # never started (yet): only the rendezvous timeout judges it
            beat = int(self._store.add(key, 0))
            last = heard.get(rank)
            if last is None or last[0] != beat:
                heard[rank] = (beat, now)
            elif now - last[1] > self.node_timeout:
                problem = (f"node {rank} stopped answering: its agent has not been heard from for "
                           f"{self.node_timeout:g} s while the others wait for it in round {k} (it was "
                           "killed, or its host is down or cut off). HINT: look at that node's output; "
                           "start it again with the whole job.")
                self._close(problem)
                raise RendezvousFailedError(problem)

    def _too_late(self, k: int) -> RendezvousFailedError:
        return RendezvousFailedError(
            f"round {k} of the rendezvous at this address was already formed without this node "
            f"(--node-rank {self.view.node_rank}): the job's nodes were all there. HINT: this node is one "
            "too many, or its job was restarted without it; start every node of the job together, each with "
            "its own --node-rank.")

    # --- closing ----------------------------------------------------------------------------------
    def _close(self, reason: str) -> None:
        self.set_closed(reason)
        with contextlib.suppress(JobStoreError, OSError):
            self._store.add(_CLOSED_SEEN, 1)

    def _raise_if_closed(self) -> None:
        if not self._store.check([_CLOSED]):
            return
        reason = self._store.get(_CLOSED).decode(errors="replace")
        with contextlib.suppress(JobStoreError, OSError):
            self._store.add(_CLOSED_SEEN, 1)
        if reason.startswith("the nodes of this job disagree"):
            raise RendezvousMismatchError(reason)
        raise RendezvousFailedError(reason)

    def _store_gone(self, exc: BaseException) -> str:
        where = self._store.address
        if self.view.node_rank == 0:
            return f"the rendezvous store at {where} failed: {exc}"
        return (f"lost node 0, which hosts the rendezvous at {where} ({exc}): its agent ended or its host "
                "is unreachable. HINT: look at node 0's output for the cause.")

    # --- heartbeat --------------------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        if self._beater is not None:
            return
        beats = self._store.clone()  # its own connection: a blocking call of the agent never delays it
        key = f"rdzv/alive/{self.view.node_rank}"

        def beat() -> None:
            # Node 0 reads a node's counter only while a round forms and waits for that node: the
            # counter moves while this node is in a round or has seen another node waiting in the next
            # one (torch's agent then restarts its ranks, however long they take to stop), not while
            # the job trains (a thousand agents beating every second were most of node 0's load).
            try:
                while not self._stop.is_set():
                    if self._in_round or self._waiting:
                        beats.add(key, 1)
                    self._nudge.wait(self._beat_every)
                    self._nudge.clear()
            except (JobStoreError, OSError):
                pass  # node 0 went away: the agent's own calls report it
            finally:
                beats.close()

        self._beater = threading.Thread(target=beat, name="ringtrain-rdzv-heartbeat", daemon=True)
        self._beater.start()


def wait_for_acknowledgements(store: JobStore, nodes: int, limit: float) -> None:
    """Node 0 after closing: wait up to ``limit`` s until the other nodes read why (then its store may go)."""
    deadline = time.monotonic() + limit
    with contextlib.suppress(JobStoreError, OSError):
        while time.monotonic() < deadline and int(store.add(_CLOSED_SEEN, 0)) < nodes:
            time.sleep(POLL_INTERVAL)


def create_handler(params: RendezvousParameters) -> RingtrainRendezvous:
    """torch's registry calls this: ``params.config`` carries ``job_store`` (a connected
    :class:`~ringtrain.engine.job_store.JobStore`), ``view`` (this node's :class:`NodeView`),
    ``bootstrap_host``, and optionally ``timeout`` and ``node_timeout`` in seconds.

    ``ringtrain run`` fills them in; the store's address and secret never go through the registry's
    parameters, which torch may log.
    """
    store = params.config.get("job_store")
    view = params.config.get("view")
    if not isinstance(store, JobStore) or not isinstance(view, NodeView):
        raise ValueError(f"the {BACKEND!r} rendezvous needs a job store and this node's view in its "
                         "configuration. HINT: it is started by `ringtrain run`; use --rdzv-backend c10d "
                         "with torchrun.")
    return RingtrainRendezvous(store, view, str(params.config.get("bootstrap_host") or "127.0.0.1"),
                               float(params.config.get("timeout", 600)),
                               float(params.config.get("node_timeout", NODE_TIMEOUT)))


def register() -> None:
    """Register :func:`create_handler` as backend ``"ringtrain"`` in torch's registry (idempotent)."""
    rendezvous_handler_registry.register(BACKEND, create_handler)



class NodeMeeting:
    """This node's side of the ringtrain rendezvous: node 0's job store, this node's connection to it,
    and the handler's configuration. :meth:`open` before the agent starts, :meth:`close` after it.

    Who hosts the store and where it listens is decided in :mod:`ringtrain.launch.store_host`.
    """

    def __init__(self, *, view: NodeView, endpoint: str, bootstrap_host: str, secret: str | None,
                 timeout: float) -> None:
        self.view = view
        self.endpoint = endpoint
        self.bootstrap_host = bootstrap_host
        self.secret = secret
        self.timeout = timeout
        self.server: Any = None
        self.client: JobStore | None = None
        #: Where this node reaches the job store (the workers get it as ``RINGTRAIN_JOB_STORE``).
        self.address = endpoint

    def open(self) -> dict[str, Any]:
        """Host the store (node 0), connect to it; returns the handler's ``rdzv_configs``."""
        from ringtrain.launch import store_host

        address = self.endpoint
        if self.view.node_rank == 0:
            self.server = store_host.host_job_store(self.endpoint, self.secret)
            bound = self.server.host
            if bound not in ("0.0.0.0", "::") and not _resolves_to(self.endpoint, bound):
                # the endpoint's name leads elsewhere here (Debian's 127.0.1.1): use the bound address
                address = self.server.address
        self.address = address
        self.client = JobStore(address, self.secret, timeout=self.timeout)
        return {"job_store": self.client, "view": self.view, "bootstrap_host": self.bootstrap_host,
                "timeout": self.timeout}

    def close(self, handler: RendezvousHandler | None) -> None:
        """Let the other nodes read why the rendezvous was closed (node 0 only), then close everything."""
        # Only other nodes read the reason: alone in the job (one node), there is no one to wait for (this
        # wait held a one-host launcher 5 s after its failure report).
        if (self.server is not None and self.client is not None and isinstance(handler, RingtrainRendezvous)
                and self.view.nnodes > 1 and handler.joined > 1 and handler.closed_reason() is not None):
            wait_for_acknowledgements(self.client, handler.joined, limit=5.0)
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.close()


def _resolves_to(endpoint: str, address: str) -> bool:
    """Whether the host of ``endpoint`` resolves to ``address`` on this host (so every node can use the
    same ``host:port`` string, the one the workers get as ``RINGTRAIN_JOB_STORE``)."""
    host = endpoint.rpartition(":")[0].strip("[]")
    try:
        return address in {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False


register()

__all__ = ["BACKEND", "NodeMeeting", "NodeView", "RingtrainRendezvous", "create_handler", "describe_mismatch",
           "register", "wait_for_acknowledgements"]
