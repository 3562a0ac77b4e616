"""torch's elastic agent, run with a record of every restart (``--max-restarts``: the whole group restarts).

:func:`run_agent` does what ``torch.distributed.launcher.api.launch_agent`` does for us (handler from
torch's rendezvous registry, one ``LocalElasticAgent``, ``ChildFailedError`` when the ranks failed),
with :class:`GroupAgent` in place of the plain agent. It adds three things:

* every restart is recorded as a :class:`Restart` (which ranks failed and how, or that another
  node restarted) and handed to ``on_restart`` as it happens, so the launcher can say so at once
  and name the first failure of the whole job in its final report;
* the workers learn their attempt number (``RINGTRAIN_ATTEMPT``): the rendezvous round where the
  handler has one (the same on every node), else the restart count;
* the exit barrier (a node whose ranks finished waits for the other nodes) ends as soon as the
  rendezvous is closed because another node gave up, instead of after torch's 300 s.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.distributed import DistStoreError
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.launcher.api import LaunchConfig as TorchLaunchConfig

from ringtrain.launch import rendezvous as _rendezvous  # registers the "ringtrain" backend
from ringtrain.launch.environ import patched_environ
from ringtrain.launch.stopping import StopGuard

#: The variable that tells a worker which attempt it belongs to (0 first, then 1 per group restart).
ENV_ATTEMPT = "RINGTRAIN_ATTEMPT"


@dataclass(frozen=True)
class Restart:
    """One restart of this node's ranks."""

    attempt: int
    """The attempt that ended (0 is the first)."""
    time: float
    failures: dict[int, ProcessFailure] = field(default_factory=dict)
    """Global rank -> failure of this node's ranks that failed; empty when another node restarted."""
    restarts_left: int = 0


class GroupAgent(LocalElasticAgent):
    """torch's agent, with restarts recorded, ``RINGTRAIN_ATTEMPT``, an exit barrier that ends on close."""

    def __init__(self, *args: Any, on_restart: Callable[[Restart], None] | None = None,
                 stop_guard: StopGuard | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_guard = stop_guard
        self.restarts: list[Restart] = []
        self._on_restart = on_restart
        self._last: RunResult | None = None
        self._starts = 0
        #: Why the rendezvous was closed while this node's ranks had finished (another node gave up).
        self.closed_while_finishing: str | None = None

    @property
    def attempt(self) -> int:
        """The attempt whose workers run now (or ran last): 0 first, one more per group restart."""
        handler = self._worker_group.spec.rdzv_handler
        if isinstance(handler, _rendezvous.RingtrainRendezvous):
            return max(handler.round, 0)
        return max(self._starts - 1, 0)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        self._last = super()._monitor_workers(worker_group)
        return self._last

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        last = self._last
        failed = last is not None and last.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        record = Restart(attempt=self.attempt, time=time.time(),
                         failures=dict(last.failures) if failed and last is not None else {},
                         restarts_left=self._remaining_restarts)
        self.restarts.append(record)
        if self._on_restart is not None:
            self._on_restart(record)
        super()._restart_workers(worker_group)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self._starts += 1
        # Workers inherit this process's environment; the variable is set only while they start.
        with patched_environ({ENV_ATTEMPT: str(self.attempt)}):
            started = super()._start_workers(worker_group)
        if self._stop_guard is not None:
            self._stop_guard.install()  # over the handlers torch installed as it started the ranks
        return started

    def rank_pids(self) -> list[int]:
        """The pids of this node's ranks running now ([] before the first start)."""
        return list(self._pcontext.pids().values()) if self._pcontext is not None else []

    def rank_errors(self) -> list[tuple[int, int, int, str]]:
        """(global rank, local rank, pid, error file) of this node's ranks of the last start whose error
        file exists: the ranks that failed on their own, whatever ended them after."""
        if self._pcontext is None or self._worker_group is None:
            return []
        files = getattr(self._pcontext, "error_files", None) or {}
        pids = self._pcontext.pids()
        return [(worker.global_rank, worker.local_rank, pids.get(worker.local_rank, -1),
                 files[worker.local_rank])
                for worker in self._worker_group.workers
                if worker.local_rank in files and os.path.isfile(files[worker.local_rank])]

    def rank_exit_codes(self) -> list[int | None]:
        """The exit codes of this node's ranks of the last start (None: still running; [] before the first
        start, or where the ranks are not subprocesses)."""
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        return [handler.proc.poll() for handler in handlers.values()]

    def _exit_barrier(self) -> None:
        group = self._worker_group
        store = self._store
        if group.group_world_size is None or group.group_world_size <= 1 or store is None:
            return
        handler = group.spec.rdzv_handler
        arrived = store.add("exit/arrived", 1)
        if arrived >= group.group_world_size:
            store.set("exit/done", "1")
        deadline = time.monotonic() + self._exit_barrier_timeout
        while time.monotonic() < deadline:
            try:
                store.wait(["exit/done"], datetime.timedelta(seconds=1))
                return
            except DistStoreError:
                pass  # not everybody yet: look whether the job was closed meanwhile
            except (ConnectionError, OSError, RuntimeError):
                return  # node 0 finished and its store is gone: nobody is left to wait for
            if isinstance(handler, _rendezvous.RingtrainRendezvous):
                with contextlib.suppress(Exception):  # closed, or node 0 gone: the next lines say which
                    if handler.num_nodes_waiting() > 0:
                        # Another node restarted after this one's ranks had finished: the group can no
                        # longer restart as a whole, so the job ends here, on every node.
                        me = handler.view
                        handler.set_closed(f"node {me.node_rank} ({me.host}) had finished its ranks when "
                                           "another node restarted its own; a restart of the whole group is "
                                           "no longer possible. HINT: look for the failure on the node that "
                                           "restarted.")
                reason = handler.closed_reason()
                if reason is not None:
                    self.closed_while_finishing = reason
                    return


def run_agent(config: TorchLaunchConfig, entrypoint: str, args: list[str],
              on_restart: Callable[[Restart], None] | None = None,
              on_agent: Callable[[GroupAgent], None] | None = None,
              stop_guard: StopGuard | None = None) -> dict[int, Any]:
    """Run one node's ranks under :class:`GroupAgent`; returns their results, raises ``ChildFailedError``.

    ``on_agent`` receives the agent before it starts (the caller reads its restarts afterwards, also
    when the ranks failed). The handler is closed with the reason when this node gives up, so the
    other nodes stop at once; it is left open when a signal stopped the agent (torch does the same).
    """
    params = RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint,
                                  run_id=config.run_id, min_nodes=config.min_nodes,
                                  max_nodes=config.max_nodes, local_addr=config.local_addr,
                                  **config.rdzv_configs)
    master_addr = master_port = None
    if config.rdzv_backend == "static":  # torch's own static handler hands the workers its endpoint
        master_addr, master_port = parse_rendezvous_endpoint(config.rdzv_endpoint, default_port=-1)
    handler = get_rendezvous_handler(params)
    spec = WorkerSpec(role=config.role, local_world_size=config.nproc_per_node, entrypoint=entrypoint,
                      args=tuple(args), rdzv_handler=handler, max_restarts=config.max_restarts,
                      monitor_interval=config.monitor_interval, master_addr=master_addr,
                      master_port=master_port, local_addr=config.local_addr)
    agent = GroupAgent(spec=spec, logs_specs=config.logs_specs, start_method=config.start_method,
                       log_line_prefix_template=config.log_line_prefix_template, on_restart=on_restart,
                       stop_guard=stop_guard)
    if on_agent is not None:
        on_agent(agent)
    close_handler = True
    try:
        result = agent.run()
        if result.is_failed():
            if isinstance(handler, _rendezvous.RingtrainRendezvous):
                handler.set_closed(_gave_up(handler, result, agent, config.max_restarts))
            raise ChildFailedError(name=str(entrypoint), failures=result.failures)
        return result.return_values
    except SignalException:
        close_handler = False
        raise
    finally:
        if close_handler:
            handler.shutdown()


def _gave_up(handler: _rendezvous.RingtrainRendezvous, result: RunResult, agent: GroupAgent,
             max_restarts: int) -> str:
    ranks = ", ".join(str(rank) for rank in sorted(result.failures)) or "?"
    restarts = len(agent.restarts)
    return (f"node {handler.view.node_rank} ({handler.view.host}) gave up: its rank(s) {ranks} failed in "
            f"attempt {agent.attempt} and no restart was left ({restarts} restart(s) done, --max-restarts "
            f"{max_restarts}). HINT: the report on that node names the cause.")
