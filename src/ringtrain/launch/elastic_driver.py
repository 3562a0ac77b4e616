"""``ringtrain run`` in elastic mode: the driver that starts the workers, watches them and re-forms the group.

Horovod's elastic model (``--min-np/--max-np/--host-discovery-script``), without torch's agent:

- The driver hosts the job store (:mod:`ringtrain.engine.job_store`) with a fresh per-job secret,
  which workers get in their environment (local ones) or on their stdin (ssh), never in argv.
- It runs the discovery (script or fixed hosts) every second, starts one worker process per slot
  (``python -m ringtrain.launch.elastic_worker COMMAND``; directly here, over ssh elsewhere; each a
  group of :mod:`ringtrain.launch.supervision`, watched with heartbeats like the static driver's
  hosts, given 30 s to stop, killed at once on a second Ctrl-C) and
  publishes each *generation* of the group: every worker's rank, size, local and cross rank/size and
  host name (:mod:`ringtrain.engine.elastic_rendezvous`).
- When a worker dies, its peers' collectives fail (``HorovodInternalError``); ``hvd.elastic.run``
  restores their last commit and re-initializes, which tells the driver they left the generation. Once
  every member has left or exited, the driver counts the failure against the host (blacklisting it
  after repeated failures), waits until ``--min-np`` slots are usable (at most ``--elastic-timeout``),
  starts workers for free slots (the dead one's slot, new hosts) and publishes the next generation;
  survivors keep their slots and the oldest becomes rank 0, so ``state.sync()`` spreads the
  committed state to the new workers.
- Hosts added by discovery (or cooldowns that end) change nothing until the workers' next
  ``state.commit()``: the driver publishes a host update, rank 0 sees it, every rank raises
  ``HostsUpdatedInterrupt`` and the group re-forms with the new hosts.
- The job ends with exit code 0 once every worker of the last generation exited 0; with the root
  cause when every worker failed, when ``--reset-limit`` is spent, or when ``--min-np`` slots are not
  there within ``--elastic-timeout``.

The driver's loop is a state machine over :class:`Phase`: each tick it takes a stop signal, the hosts'
cooldowns and the workers' heartbeats and exits, then runs the current phase's method, which returns
the next phase (WAITING_FOR_HOSTS and RE_FORMING form a generation, RUNNING watches it, BREAKING waits
for its members to leave, FINISHING for their exits, STOPPING ends on a signal, DONE holds the exit
code). What to do next (blacklist a host, form, wait, re-form, give up) is decided by the pure
:class:`~ringtrain.launch.elastic_policy.ElasticPolicy`; the driver acts on its decisions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from ringtrain.engine import elastic_rendezvous as rdzv
from ringtrain.engine import job_store
from ringtrain.engine.netutil import route_address
from ringtrain.engine.settings import read_knob
from ringtrain.exceptions import UsageError
from ringtrain.launch import link, store_host, supervision
from ringtrain.launch.backend import Backend, WorkerStart, log
from ringtrain.launch.backends import select_backend
from ringtrain.launch.config import LaunchConfig, worker_environment
from ringtrain.launch.elastic_hosts import (
    DiscoveryError,
    HostRegistry,
    Survivor,
    plan_generation,
)
from ringtrain.launch.elastic_policy import (
    DEFAULT_ELASTIC_TIMEOUT,
    Action,
    Cause,
    Decision,
    ElasticPolicy,
    ElasticSettings,
    HostAction,
    Plan,
    WorkerEnd,
)
from ringtrain.launch.hosts import is_local_host
from ringtrain.launch.report import RankFailure, earliest, format_report
from ringtrain.launch.stopping import stopping_line

#: Seconds between two runs of the discovery (horovodrun's DISCOVER_HOSTS_FREQUENCY_SECS).
DISCOVERY_PERIOD = 1.0


class Phase(Enum):
    """Where the job stands: the driver's loop runs the current phase's method each tick."""

    WAITING_FOR_HOSTS = "waiting for the first generation's -np slots"
    RUNNING = "a generation runs: joins, host updates"
    BREAKING = "a generation broke: its members leave or exit"
    RE_FORMING = "survivors wait for --min-np slots, then the next generation forms"
    FINISHING = "a member finished: the others' exits"
    STOPPING = "a stop signal arrived"
    DONE = "the job is over (exit_code)"


@dataclass
class Worker:
    """One worker of the job: its id, its slot's local rank, and the group (of one rank) it runs as."""

    wid: str
    local_rank: int
    group: supervision.RankGroup
    #: The driver has taken note of the exit (failures are recorded once).
    reaped: bool = False


@dataclass
class Generation:
    """The newest generation formed: what RUNNING, BREAKING and FINISHING read and write (and the
    failures of its members, until the next one forms)."""

    assignment: rdzv.Assignment
    formed_at: float
    #: Members that left it (their left keys), read again when the store's counter moves.
    left: set[str] = field(default_factory=set)
    left_count: int = 0
    #: When it broke (a member failed or left) and its abort key was set; None while it runs.
    broken_since: float | None = None
    #: Members known to have reached ``hvd.init()`` (or killed for not reaching it).
    joined: set[str] = field(default_factory=set)
    #: Hosts with a failure counted against them in this generation (once each).
    failed_hosts: set[str] = field(default_factory=set)
    #: The slots of the last host update published, and the registry version last looked at.
    notified: frozenset[tuple[str, int]] | None = None
    checked_version: int = -1

    @property
    def number(self) -> int:
        return self.assignment.generation

    @property
    def members(self) -> Mapping[str, rdzv.Slot]:
        return self.assignment.workers


@dataclass
class Regrouping:
    """The wait for the next generation (the first one too): what WAITING_FOR_HOSTS and RE_FORMING read."""

    since: float
    #: Members of the broken generation that left it alive and wait for the next one.
    survivors: dict[str, Survivor] = field(default_factory=dict)


@dataclass(frozen=True)
class Observation:
    """One tick's look at the current generation's members: exit codes (None: running, or an exit not
    reaped yet) and who left."""

    codes: Mapping[str, int | None]
    left: set[str]

    @property
    def succeeded(self) -> list[str]:
        return [wid for wid, code in self.codes.items() if code == 0]

    @property
    def failed(self) -> list[str]:
        return [wid for wid, code in self.codes.items() if code not in (None, 0)]

    @property
    def waiting(self) -> list[str]:
        """Members still in the generation: neither exited nor left."""
        return [wid for wid, code in self.codes.items() if code is None and wid not in self.left]


class ElasticDriver:
    """Runs one elastic job: ``ElasticDriver(config, environ).run()`` returns the launcher's exit code.

    ``clock`` and ``sleep`` (seconds, monotonic) are the loop's and the host registry's; tests pass
    their own and call :meth:`tick`.
    """

    server: job_store.JobStoreServer
    store: job_store.JobStore

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], backend: Backend | None = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        # --- what the job is (fixed for its whole run) ---
        self.config = config
        self.environ = dict(environ)
        self.settings = ElasticSettings.from_config(config, environ)
        self.policy = ElasticPolicy(self.settings, start_timeout=config.start_timeout)
        self.clock = clock
        self.sleep = sleep
        #: Where the workers run: the hosts it finds, how a worker starts there (launch/backend.py);
        #: None: the one the configuration names (select_backend).
        self.backend = backend if backend is not None else select_backend(config, self.settings.num_proc)
        self.registry = HostRegistry(cooldown_range=self.settings.cooldown_range,
                                     failures_to_blacklist=self.settings.failures_to_blacklist, clock=clock)
        # the user's exported secret where there is one (RayExecutor elastic jobs hand theirs over)
        self.secret = store_host.node_secret(self.environ, whole_job_here=True) or job_store.new_secret()
        # A worker silent for this long is given up, as the static driver gives up a silent host.
        peer_timeout = float(read_knob("peer_timeout_s", self.environ))
        self.silence_limit = link.contact_timeout(peer_timeout)
        self.pulse = supervision.Pulse(self.backend.beat_interval(peer_timeout))
        # --- shared with the discovery thread and the signal handlers ---
        self.lock = threading.Lock()
        self.signals = supervision.StopSignals()
        self._stopping = threading.Event()
        self._discovery_problem: str | None = None
        # --- the whole job's record ---
        self.workers: dict[str, Worker] = {}
        self.failures: list[RankFailure] = []
        self.resets = 0
        self.updates = 0
        self.next_id = 0
        self.exit_code: int | None = None
        # --- the state: the phase, the newest generation, the wait for the next one ---
        self.phase = Phase.WAITING_FOR_HOSTS
        self.current: Generation | None = None
        self.waiting: Regrouping | None = Regrouping(since=clock())
        self._steps: dict[Phase, Callable[[], Phase]] = {
            Phase.WAITING_FOR_HOSTS: self._waiting_for_hosts, Phase.RUNNING: self._running,
            Phase.BREAKING: self._breaking, Phase.RE_FORMING: self._re_forming,
            Phase.FINISHING: self._finishing, Phase.STOPPING: self._stop, Phase.DONE: lambda: Phase.DONE,
        }

    @property
    def generation(self) -> int:
        """The newest generation's number (0 before the first)."""
        return self.current.number if self.current is not None else 0

    # --- the job store ---------------------------------------------------------------------------
    def _bind_host(self) -> str:
        # beyond loopback, every connection must prove the job's secret before the store reads a byte
        return "0.0.0.0" if self.backend.listens_beyond_loopback() else "127.0.0.1"

    def _store_address_for(self, host: str, port: int) -> str:
        if is_local_host(host):
            return job_store.join_address("127.0.0.1", port)
        return job_store.join_address(route_address(host) or socket.getfqdn(), port)

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.backend.release()

    def _run(self) -> int:
        try:
            self.registry.update(self.backend.find())
        except DiscoveryError as exc:
            raise UsageError(str(exc)) from None
        self.server = job_store.JobStoreServer(self.secret, host=self._bind_host())
        self.store = job_store.JobStore(job_store.join_address("127.0.0.1", self.server.port), self.secret,
                                       timeout=60.0)
        thread = threading.Thread(target=self._discover, name="ringtrain-elastic-discovery", daemon=True)
        thread.start()
        try:
            with self.signals:
                try:
                    return self._loop()
                finally:
                    self._stopping.set()
                    self._stop_workers()
        finally:
            self.store.close()
            self.server.close()

    def _discover(self) -> None:
        while not self._stopping.wait(DISCOVERY_PERIOD):
            try:
                found = self.backend.find()
            except DiscoveryError as exc:
                if str(exc) != self._discovery_problem:
                    log(f"discovery failed (retrying every {DISCOVERY_PERIOD:g} s): {exc}")
                self._discovery_problem = str(exc)
                continue
            self._discovery_problem = None
            if self.registry.update(found):
                listing = ",".join(f"{h}:{s}" for h, s in found.items()) or "no host"
                log(f"discovery: {listing}")

    def _loop(self) -> int:
        assert self.waiting is not None
        self.waiting.since = self.clock()
        while self.tick() is not Phase.DONE:
            self.sleep(supervision.TICK)
        assert self.exit_code is not None
        return self.exit_code

    def tick(self) -> Phase:
        """One round: a stop signal ends the job; else the hosts' cooldowns, the workers' heartbeats and
        exits, then the current phase's work, which says the next phase."""
        if self.signals.first is not None:
            self.phase = Phase.STOPPING
        else:
            for back in self.registry.refresh():
                log(f"host {back} is back from the blacklist (its cooldown ended)")
            self._watch_liveness()
            self._reap()
        self.phase = self._steps[self.phase]()
        return self.phase

    def _done(self, code: int) -> Phase:
        self.exit_code = code
        return Phase.DONE

    def _stop(self) -> Phase:
        """STOPPING: the workers are stopped once the loop ends (``run``)."""
        signum = self.signals.first
        assert signum is not None
        decision = self.policy.on_stop(signum)
        log(stopping_line(signum, supervision.SHUTDOWN_GRACE, where=" on every host"))
        log(f"stopped by {signal.Signals(signum).name}; every worker was stopped.")
        assert decision.exit_code is not None
        return self._done(decision.exit_code)

    # --- workers coming and going ----------------------------------------------------------------
    def _watch_liveness(self) -> None:
        """Heartbeats to the running workers; one silent for the peer timeout is killed as lost."""
        running = [w.group for w in self.workers.values() if not w.reaped]
        self.pulse(running)
        for group in running:
            if group.check_silence(self.silence_limit):
                group.kill()  # its ssh waits on a dead connection: nothing more will come through it

    def _reap(self) -> None:
        members = self.current.members if self.current is not None else {}
        survivors = self.waiting.survivors if self.waiting is not None else {}
        for wid, worker in self.workers.items():
            code = worker.group.poll()
            if worker.reaped or code is None:
                continue
            worker.reaped = True
            slot = members.get(wid)
            if wid in survivors and code != 0:
                # A survivor died while waiting for the next generation: one failure, without a rank
                # (the broken generation's was already given up), and its host counted once.
                del survivors[wid]
                self._record_failure(worker, code, rank=-1)
                continue
            if slot is None or code == 0:
                continue
            self._record_failure(worker, code, rank=slot.rank)

    def _record_failure(self, worker: Worker, code: int, rank: int) -> None:
        assert self.current is not None
        failed_hosts = self.current.failed_hosts
        group = worker.group
        group.join_output(timeout=2.0)
        failure = RankFailure(host=group.host, rank=rank, local_rank=worker.local_rank, exitcode=code,
                              pid=group.pid, time=group.ended_at or time.time(),
                              message=f"elastic worker {worker.wid} (generation {self.generation})",
                              output_tail="".join(group.tail),
                              state="unreachable" if group.silent_for is not None else "")
        self.failures.append(failure)
        verdict = self.policy.judge_failure(WorkerEnd(
            code=code, reached_store=self.store.check([rdzv.alive_key(worker.wid)]),
            lost_heartbeat=group.silent_for is not None, unreachable=group.unreachable(),
            lost_contact=group.lost_contact(), host_failed_already=group.host in failed_hosts))
        what = self._failure_text(verdict.cause, worker, failure)
        log(f"worker {worker.wid} (rank {rank} on {group.host}) failed: {what}")
        if verdict.host is HostAction.BLACKLIST:
            # The host cannot run workers at all: no second try.
            self.registry.record_unreachable(group.host, f"worker {worker.wid}: {what}")
            log(f"host {group.host} is blacklisted: no worker can start there")
        elif verdict.host is HostAction.COUNT_FAILURE:
            failed_hosts.add(group.host)
            if self.registry.record_failure(group.host, f"worker {worker.wid}: {what}"):
                log(f"host {group.host} is blacklisted after repeated failures "
                    f"({self.registry.describe()})")
        self._after_failure(group)

    def _failure_text(self, cause: Cause, worker: Worker, failure: RankFailure) -> str:
        group = worker.group
        if cause is Cause.LOST_HEARTBEAT:
            return (f"lost contact with host {group.host}: no word from the worker for "
                    f"{group.silent_for or 0.0:.0f} s (RINGTRAIN_PEER_TIMEOUT_SECONDS): the host is down or "
                    "the network to it is cut")
        if cause is Cause.NO_JOB_STORE:
            return "it could not reach the job store from its host"
        if cause is Cause.NOT_STARTED:
            return self._not_started_text(worker)
        if cause is Cause.LOST_CONTACT:  # ssh's keep-alives gave up on the host before the heartbeats did
            return group.describe_end(f"worker {worker.wid}")
        return failure.status()

    def _start_worker(self, wid: str, slot: rdzv.Slot, assignment: rdzv.Assignment) -> None:
        host = slot.hostname
        local = is_local_host(host)
        address = self._store_address_for(host, self.server.port)
        ours = {
            **slot.horovod_variables(),
            "HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": job_store.split_address(address)[0],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.server.port),
            rdzv.ENV_WORKER: wid, rdzv.ENV_GENERATION: str(assignment.generation),
            job_store.ENV_ADDRESS: address,
        }
        # Workers sharing this machine (two host names of it count as one machine) share its cores.
        sharing = slot.local_size
        if local:
            sharing = sum(1 for s in assignment.workers.values() if is_local_host(s.hostname))
        ours.update(worker_environment(self.config, self.environ, sharing, local_only=False))
        argv = [sys.executable, "-u", "-m", "ringtrain.launch.elastic_worker", *self.config.command]
        group = self.backend.start_worker(WorkerStart(
            wid=wid, host=host, rank=slot.rank, argv=argv, ours=ours, environ=self.environ,
            secret=self.secret, lock=self.lock, silence_limit=self.silence_limit,
            beat_interval=self.pulse.interval, verbose=self.config.verbose))
        self.workers[wid] = Worker(wid, slot.local_rank, group)

    def _stop_workers(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            self.store.set(rdzv.STOP, "the driver is ending the job")
        live = [w.group for w in self.workers.values() if w.group.poll() is None]
        supervision.stop_all(live, self.signals, log)
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.group.wait(timeout=5.0)
            worker.group.join_output(timeout=2.0)

    def _not_started_text(self, worker: Worker) -> str:
        """A worker its place could not start, in its backend's words (ssh's last line, Ray's actor)."""
        return self.backend.not_started_text(worker.wid, worker.group)

    def _after_failure(self, group: supervision.RankGroup) -> None:
        if self.backend.hosts_changed(group):
            # A lost host leaves the hosts now: the next generation may be planned before the
            # discovery thread's next round.
            with contextlib.suppress(DiscoveryError):
                self.registry.update(self.backend.find())

    # --- between generations: WAITING_FOR_HOSTS and RE_FORMING ---------------------------------
    def _waiting_for_hosts(self) -> Phase:
        """The first generation: -np slots (within --elastic-timeout)."""
        return self._form_or_wait(first=True)

    def _re_forming(self) -> Phase:
        """The next generation: --min-np slots (within --elastic-timeout) and a survivor placed in it."""
        return self._form_or_wait(first=False)

    def _form_or_wait(self, first: bool) -> Phase:
        waiting = self.waiting
        assert waiting is not None
        decision = self.policy.formation(first=first, survivors=list(waiting.survivors.values()),
                                         available=self.registry.available(),
                                         waited=self.clock() - waiting.since,
                                         hosts=self.registry.describe(), source=self.backend.describe())
        if decision.action is Action.WAIT_FOR_HOSTS:
            return self.phase
        if decision.action is Action.GIVE_UP:
            return self._give_up(decision)
        self._form(decision.plan)
        return Phase.RUNNING

    def _form(self, plan: Plan) -> None:
        """Publish the next generation and start its new workers (survivors keep theirs)."""
        number = self.generation + 1
        workers = {}
        new = []
        for wid, slot in plan:
            if wid is None:
                self.next_id += 1
                wid = f"w{self.next_id}"
                new.append((wid, slot))
            workers[wid] = slot
        assignment = rdzv.Assignment(number, self.updates, workers)
        self.store.set(rdzv.assignment_key(number), assignment.to_json())
        self.store.set(rdzv.CURRENT, str(number))
        for wid, slot in new:
            self._start_worker(wid, slot, assignment)
        hosts = ",".join(f"{s.hostname}[{s.local_rank}]" for s in workers.values())
        log(f"generation {number}: {len(workers)} worker(s) on {hosts}" +
            (f"; started {', '.join(w for w, _ in new)}" if new else ""))
        self.current = Generation(assignment, formed_at=self.clock())
        self.waiting = None

    # --- a generation: RUNNING, BREAKING, FINISHING --------------------------------------------
    def _observe(self) -> tuple[Generation, Observation]:
        gen = self.current
        assert gen is not None
        count = int(self.store.add(rdzv.left_count_key(gen.number), 0))
        if count != gen.left_count:
            gen.left_count = count
            for wid in gen.members:
                if wid not in gen.left and self.store.check([rdzv.left_key(gen.number, wid)]):
                    gen.left.add(wid)
        # Only exits _reap has seen count: a failure is recorded before it changes the generation.
        codes = {wid: self.workers[wid].group.poll() if self.workers[wid].reaped else None
                 for wid in gen.members}
        return gen, Observation(codes, gen.left)

    def _running(self) -> Phase:
        """Members join, hosts change; a member that exits 0 ends the job, one that fails or leaves
        breaks the generation."""
        gen, seen = self._observe()
        if seen.succeeded:
            return self._finishing(seen)
        if seen.failed or gen.left:
            gen.broken_since = self.clock()
            reason = (f"worker {seen.failed[0]} failed" if seen.failed
                      else f"worker {sorted(gen.left)[0]} left generation {gen.number}")
            self.store.set(rdzv.abort_key(gen.number), reason)
            return self._breaking(seen)
        self._check_joined(gen)
        self._check_host_updates(gen)
        return Phase.RUNNING

    def _breaking(self, seen: Observation | None = None) -> Phase:
        """The generation broke: once every member has left or exited, re-form (or give up)."""
        gen, seen = self._observe() if seen is None else (self._current(), seen)
        if seen.succeeded:
            return self._finishing(seen)
        if seen.waiting:
            assert gen.broken_since is not None
            if self.policy.overdue_leaving(self.clock() - gen.broken_since):
                for wid in seen.waiting:
                    log(f"worker {wid} did not leave generation {gen.number} within --elastic-timeout "
                        f"{self.settings.timeout:g} s after it broke; killing it")
                    self.workers[wid].group.kill()
            return Phase.BREAKING
        decision = self.policy.after_break(resets=self.resets, failed=len(seen.failed))
        if decision.action is Action.GIVE_UP:
            return self._give_up(decision)
        self.resets = decision.reset
        members = gen.members
        survivors = {wid: Survivor(wid, members[wid].hostname, members[wid].local_rank, members[wid].rank)
                     for wid in gen.left if seen.codes[wid] is None}
        self.waiting = Regrouping(since=self.clock(), survivors=survivors)
        limit = "" if self.settings.reset_limit is None else f" of at most {self.settings.reset_limit}"
        if decision.after_failure:
            log(f"generation {gen.number} broke: {len(seen.failed)} worker(s) failed, {len(survivors)} wait "
                f"to go on; re-forming the group (reset {self.resets}{limit})")
        else:
            log(f"generation {gen.number} ends: its {len(survivors)} worker(s) re-form the group for the "
                f"changed hosts (reset {self.resets}{limit})")
        return Phase.RE_FORMING

    def _finishing(self, seen: Observation | None = None) -> Phase:
        """A member exited 0: the job is over once every member has exited."""
        if seen is None:
            _, seen = self._observe()
        decision = self.policy.ending(seen.codes, seen.left)
        if decision.action is Action.WAIT_FOR_EXITS:
            if decision.stop_waiting:
                self.store.set(rdzv.STOP, "a worker finished the job while others waited to re-form")
            return Phase.FINISHING
        if decision.action is Action.FINISH:
            if self.resets:
                log(f"job finished after {self.resets} re-formation(s) of the group "
                    f"({self.generation} generations)")
            return self._done(0)
        return self._give_up(decision)

    def _current(self) -> Generation:
        assert self.current is not None
        return self.current

    def _check_joined(self, gen: Generation) -> None:
        """A member that never reaches ``hvd.init()`` would hold the others forever: bounded here."""
        missing = [wid for wid in gen.members if wid not in gen.joined]
        for wid in missing:
            if self.store.check([rdzv.joined_key(gen.number, wid)]):
                gen.joined.add(wid)
            elif self.policy.overdue_joining(self.clock() - gen.formed_at):
                log(f"worker {wid} did not reach hvd.init() within --start-timeout + --elastic-timeout "
                    f"({self.config.start_timeout:g} + {self.settings.timeout:g} s) of generation "
                    f"{gen.number}; killing it")
                self.workers[wid].group.kill()
                gen.joined.add(wid)  # its exit is a failure like any other

    def _check_host_updates(self, gen: Generation) -> None:
        """Publish a host update when the usable hosts would change the running generation."""
        if self.registry.version == gen.checked_version:
            return
        gen.checked_version = self.registry.version
        members = gen.members
        current = frozenset((s.hostname, s.local_rank) for s in members.values())
        available = self.registry.available()
        desired: frozenset[tuple[str, int]] = frozenset()
        if sum(slots for _, slots in available) >= self.settings.min_np:
            survivors = [Survivor(w, s.hostname, s.local_rank, s.rank) for w, s in members.items()]
            desired = frozenset((s.hostname, s.local_rank)
                                for _, s in plan_generation(available, survivors, self.settings.max_np))
        if desired == current or desired == gen.notified:
            return
        gen.notified = desired
        result = (2 if desired - current else 0) | (1 if current - desired else 0)
        self.updates += 1
        update = {"timestamp": time.time(), "result": result}
        self.store.set(rdzv.update_key(self.updates), json.dumps(update))
        added = sorted(f"{h}[{lr}]" for h, lr in desired - current)
        removed = sorted(f"{h}[{lr}]" for h, lr in current - desired)
        parts = ([f"new slots {','.join(added)}"] if added else []) + \
            ([f"slots gone {','.join(removed)}"] if removed else [])
        log(f"hosts changed ({'; '.join(parts)}): the workers re-form at their next state.commit()")

    # --- the end ---------------------------------------------------------------------------------
    def _give_up(self, decision: Decision) -> Phase:
        """Say why the job stops (with the root cause, where a worker failed) and end it."""
        reason = decision.reason
        if reason:
            log(f"the job stops: {reason}")
        root = earliest(self.failures)
        if root is not None:
            print(format_report(root, len(self.failures), others=self.failures), file=sys.stderr, flush=True)
        elif not reason:
            log("the job failed without a worker failure on record")
        assert decision.exit_code is not None
        return self._done(decision.exit_code)


def launch_elastic(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run ``config.command`` as an elastic job; returns the launcher's exit code (``launch`` checked
    the command already)."""
    driver = ElasticDriver(config, dict(os.environ if environ is None else environ))
    if config.verbose:
        log(f"settings {driver.settings}; hosts from {driver.backend.describe()}")
    return driver.run()


__all__ = ["DEFAULT_ELASTIC_TIMEOUT", "DISCOVERY_PERIOD", "ElasticDriver", "ElasticSettings",
           "launch_elastic"]
