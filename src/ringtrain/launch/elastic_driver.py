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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ringtrain.engine import elastic_rendezvous as rdzv
from ringtrain.engine import job_store
from ringtrain.engine.auth import ENV_SECRET
from ringtrain.engine.netutil import route_address
from ringtrain.engine.settings import read_knob
from ringtrain.exceptions import UsageError
from ringtrain.launch import link, store_host, supervision
from ringtrain.launch.config import LaunchConfig, worker_environment
from ringtrain.launch.elastic_hosts import (
    DEFAULT_FAILURES_TO_BLACKLIST,
    DiscoveryError,
    FixedHosts,
    HostRegistry,
    ScriptDiscovery,
    Survivor,
    plan_generation,
)
from ringtrain.launch.elastic_worker import ENV_SECRET_ON_STDIN, UNREACHABLE_EXIT
from ringtrain.launch.hosts import is_local_host
from ringtrain.launch.places import PLACES
from ringtrain.launch.remote import forwarded_environment
from ringtrain.launch.report import RankFailure, earliest, format_report
from ringtrain.launch.stopping import stopping_line

#: Seconds between two runs of the discovery (horovodrun's DISCOVER_HOSTS_FREQUENCY_SECS).
DISCOVERY_PERIOD = 1.0
#: horovodrun's default --elastic-timeout (also HOROVOD_ELASTIC_TIMEOUT).
DEFAULT_ELASTIC_TIMEOUT = 600.0
#: Variables of an enclosing launcher that must not leak into workers (their rank comes from us).
_FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def log(message: str) -> None:
    print(f"ringtrain elastic: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic part of a ``LaunchConfig``, with every default resolved."""

    num_proc: int
    min_np: int
    max_np: int | None
    timeout: float
    reset_limit: int | None
    cooldown_range: tuple[int, int] | None
    failures_to_blacklist: int

    @classmethod
    def from_config(cls, config: LaunchConfig, environ: Mapping[str, str]) -> ElasticSettings:
        num_proc = config.num_proc or config.min_np or 1
        timeout = config.elastic_timeout
        if timeout is None:
            timeout = _read_number(environ, "HOROVOD_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT, "seconds", 0)
        failures = int(_read_number(environ, "RINGTRAIN_ELASTIC_FAILURES_TO_BLACKLIST",
                                    DEFAULT_FAILURES_TO_BLACKLIST, "failed generations", 1))
        return cls(num_proc=num_proc, min_np=config.min_np or num_proc, max_np=config.max_np,
                   timeout=float(timeout), reset_limit=config.reset_limit,
                   cooldown_range=config.cooldown_range,
                   failures_to_blacklist=failures)


def _read_number(environ: Mapping[str, str], name: str, default: float, unit: str, lowest: float) -> float:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= lowest or value == float("inf"):
        raise UsageError(f"{name}={text!r} is not a number of {unit} >= {lowest:g}. HINT: set it to e.g. "
                         f"{default:g}, or unset it.")
    return value


@dataclass
class Worker:
    """One worker of the job: its id, its slot's local rank, and the group (of one rank) it runs as."""

    wid: str
    local_rank: int
    group: supervision.RankGroup
    #: The driver has taken note of the exit (failures are recorded once).
    reaped: bool = False


class ElasticDriver:
    """Runs one elastic job: ``ElasticDriver(config, environ).run()`` returns the launcher's exit code."""

    def __init__(self, config: LaunchConfig, environ: Mapping[str, str], ray_hosts: Any = None) -> None:
        self.config = config
        self.environ = dict(environ)
        self.settings = ElasticSettings.from_config(config, environ)
        #: ``--ray``: the Ray cluster's nodes are the hosts and each worker runs in an actor there
        #: (a :class:`ringtrain.launch.ray_elastic.RayHosts`); None: hosts reached by ssh or locally.
        self.ray_hosts = ray_hosts
        if ray_hosts is not None:
            self.discovery = ray_hosts
        elif config.host_discovery_script:
            self.discovery: Any = ScriptDiscovery(config.host_discovery_script, config.slots_per_host,
                                                  timeout=max(config.start_timeout, 10.0))
        elif config.hosts:
            self.discovery = FixedHosts({h.host: h.slots for h in config.hosts}, "-H/--hostfile")
        else:
            self.discovery = FixedHosts({"localhost": self.settings.num_proc}, "this machine")
        self.registry = HostRegistry(cooldown_range=self.settings.cooldown_range,
                                     failures_to_blacklist=self.settings.failures_to_blacklist)
        # the user's exported secret where there is one (RayExecutor elastic jobs hand theirs over)
        self.secret = store_host.node_secret(self.environ, whole_job_here=True) or job_store.new_secret()
        self.lock = threading.Lock()
        self.workers: dict[str, Worker] = {}
        self.failures: list[RankFailure] = []
        self.generation = 0
        self.assignment: rdzv.Assignment | None = None
        self.left: set[str] = set()
        self.left_count = 0
        self.broken_since: float | None = None
        self.formed_at = 0.0
        self.joined: set[str] = set()
        self.failed_hosts: set[str] = set()
        self.resets = 0
        self.updates = 0
        self.notified: frozenset[tuple[str, int]] | None = None
        self.checked_version = -1
        self.survivors: dict[str, Survivor] = {}
        self.waiting_since: float | None = None
        self.next_id = 0
        self.signals = supervision.StopSignals()
        # A worker silent for this long is given up, as the static driver gives up a silent host.
        peer_timeout = float(read_knob("peer_timeout_s", self.environ))
        self.silence_limit = link.contact_timeout(peer_timeout)
        # an actor call each way per beat on Ray: beats as sparse as the silence limit allows there
        self.pulse = supervision.Pulse(link.sparse_beat_interval(peer_timeout) if ray_hosts is not None
                                       else link.beat_interval(peer_timeout))
        self._stopping = threading.Event()
        self._discovery_problem: str | None = None

    # --- the job store ---------------------------------------------------------------------------
    def _bind_host(self) -> str:
        fixed = isinstance(self.discovery, FixedHosts)
        if fixed and all(is_local_host(h) for h in self.discovery.hosts):
            return "127.0.0.1"
        # Hosts may come from anywhere (discovery) or sit on other machines: every interface, and
        # every connection must prove the job's secret before the store reads a byte of it.
        return "0.0.0.0"

    def _store_address_for(self, host: str, port: int) -> str:
        if is_local_host(host):
            return job_store.join_address("127.0.0.1", port)
        return job_store.join_address(route_address(host) or socket.getfqdn(), port)

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            self.registry.update(self.discovery.find())
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
                found = self.discovery.find()
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
        self.waiting_since = time.monotonic()
        while True:
            if self.signals.first is not None:
                log(stopping_line(self.signals.first, supervision.SHUTDOWN_GRACE, where=" on every host"))
                log(f"stopped by {signal.Signals(self.signals.first).name}; every worker was stopped.")
                return 128 + self.signals.first
            for back in self.registry.refresh():
                log(f"host {back} is back from the blacklist (its cooldown ended)")
            self._watch_liveness()
            self._reap()
            if self.assignment is None or self.waiting_since is not None:
                result = self._try_to_form()
            else:
                result = self._watch_generation()
            if result is not None:
                return result
            time.sleep(supervision.TICK)

    # --- workers coming and going ----------------------------------------------------------------
    def _watch_liveness(self) -> None:
        """Heartbeats to the running workers; one silent for the peer timeout is killed as lost."""
        running = [w.group for w in self.workers.values() if not w.reaped]
        self.pulse(running)
        for group in running:
            if group.check_silence(self.silence_limit):
                group.kill()  # its ssh waits on a dead connection: nothing more will come through it

    def _reap(self) -> None:
        members = self.assignment.workers if self.assignment else {}
        for wid, worker in self.workers.items():
            code = worker.group.poll()
            if worker.reaped or code is None:
                continue
            worker.reaped = True
            slot = members.get(wid)
            if wid in self.survivors and code != 0:
                # A survivor died while waiting for the next generation.
                del self.survivors[wid]
                self._record_failure(worker, code, rank=-1)
            if slot is None or code == 0 or self.assignment is None:
                continue
            self._record_failure(worker, code, rank=slot.rank)

    def _record_failure(self, worker: Worker, code: int, rank: int) -> None:
        group = worker.group
        group.join_output(timeout=2.0)
        failure = RankFailure(host=group.host, rank=rank, local_rank=worker.local_rank, exitcode=code,
                              pid=group.pid, time=group.ended_at or time.time(),
                              message=f"elastic worker {worker.wid} (generation {self.generation})",
                              output_tail="".join(group.tail),
                              state="unreachable" if group.silent_for is not None else "")
        self.failures.append(failure)
        reached = self.store.check([rdzv.alive_key(worker.wid)])
        what = failure.status()
        if group.silent_for is not None:
            what = (f"lost contact with host {group.host}: no word from the worker for "
                    f"{group.silent_for:.0f} s (RINGTRAIN_PEER_TIMEOUT_SECONDS): the host is down or the "
                    "network to it is cut")
        elif not reached and code == UNREACHABLE_EXIT:
            what = "it could not reach the job store from its host"
        elif not reached and group.unreachable():
            what = group.describe_end(f"worker {worker.wid}") if self.ray_hosts is not None else \
                f"ssh could not start it ({(group.tail or ['no output'])[-1].strip()})"
        elif group.lost_contact():  # ssh's keep-alives gave up on the host before the heartbeats did
            what = group.describe_end(f"worker {worker.wid}")
        log(f"worker {worker.wid} (rank {rank} on {group.host}) failed: {what}")
        if not reached and (code == UNREACHABLE_EXIT or group.unreachable()):
            # The host cannot run workers at all: no second try.
            self.registry.record_unreachable(group.host, f"worker {worker.wid}: {what}")
            log(f"host {group.host} is blacklisted: no worker can start there")
        elif group.host not in self.failed_hosts:
            self.failed_hosts.add(group.host)
            if self.registry.record_failure(group.host, f"worker {worker.wid}: {what}"):
                log(f"host {group.host} is blacklisted after repeated failures "
                    f"({self.registry.describe()})")
        if self.ray_hosts is not None and group.lost_contact():
            # A lost Ray node leaves the hosts now: the next generation may be planned before the
            # discovery thread's next round (the Ray discovery leaves out nodes whose actors were lost).
            with contextlib.suppress(DiscoveryError):
                self.registry.update(self.discovery.find())

    def _start_worker(self, wid: str, slot: rdzv.Slot) -> None:
        host = slot.hostname
        local = is_local_host(host)
        address = self._store_address_for(host, self.server.port)
        ours = {
            **slot.horovod_variables(),
            "HOROVOD_ELASTIC": "1", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": job_store.split_address(address)[0],
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.server.port),
            rdzv.ENV_WORKER: wid, rdzv.ENV_GENERATION: str(self.generation), job_store.ENV_ADDRESS: address,
        }
        # Workers sharing this machine (two host names of it count as one machine) share its cores.
        sharing = slot.local_size
        if local and self.assignment is not None:
            sharing = sum(1 for s in self.assignment.workers.values() if is_local_host(s.hostname))
        ours.update(worker_environment(self.config, self.environ, sharing, local_only=False))
        argv = [sys.executable, "-u", "-m", "ringtrain.launch.elastic_worker", *self.config.command]
        if self.ray_hosts is not None:
            # as over ssh: the launcher's variables travel, the secret goes on the worker's stdin
            sent = {**ours, ENV_SECRET_ON_STDIN: "1", link.ENV_BEAT_INTERVAL: f"{self.pulse.interval:g}"}
            forwarded = forwarded_environment(self.environ, sent)
            for name in (ENV_SECRET, *_FOREIGN):
                forwarded.pop(name, None)
            group = self.ray_hosts.start(host, argv, forwarded, self.secret, slot.rank, self.lock)
            self.workers[wid] = Worker(wid, slot.local_rank, group)
            if self.config.verbose:
                log(f"worker {wid} on Ray node {host}: agent pid {group.pid}")
        elif local:
            env = {k: v for k, v in self.environ.items()
                   if k not in _FOREIGN and not k.startswith("TORCHELASTIC_")}
            env.update(ours)
            env[ENV_SECRET] = self.secret
            self._spawn(wid, slot, "local", argv, env)
        else:
            forwarded = forwarded_environment(self.environ, {**ours, ENV_SECRET_ON_STDIN: "1"})
            for name in (ENV_SECRET, *_FOREIGN):
                forwarded.pop(name, None)
            forwarded = {k: v for k, v in forwarded.items() if not k.startswith("TORCHELASTIC_")}
            group = self._spawn(wid, slot, "ssh", argv, forwarded)
            if self.config.verbose:
                log(f"worker {wid} on {host}: {' '.join(group.proc.args)}")
            # The secret travels on the ssh channel, never on the remote command line.
            link.send_secret(group.proc.stdin, self.secret)

    def _spawn(self, wid: str, slot: rdzv.Slot, place: str, argv: list[str],
               env: dict[str, str]) -> supervision.ProcessGroup:
        reach = supervision.Reach(port=self.config.ssh_port, identity_file=self.config.ssh_identity_file,
                                  connect_timeout=self.config.start_timeout, alive_timeout=self.silence_limit)
        try:
            # talks=False: a worker speaks the link once it beats (a command exec'd as another
            # program never does, and its stdin gets nothing of ours)
            group = PLACES[place](slot.hostname, argv, env, reach=reach, talks=False, lock=self.lock)
        except OSError as exc:
            program, fix = ("ssh", "install the ssh client") if place == "ssh" else \
                (argv[0], "check the Python installation")
            raise UsageError(f"cannot start worker {wid} on {slot.hostname}: {program}: {exc.strerror}. "
                             f"HINT: {fix} on this machine.") from None
        self.workers[wid] = Worker(wid, slot.local_rank, group)
        return group

    def _stop_workers(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            self.store.set(rdzv.STOP, "the driver is ending the job")
        live = [w.group for w in self.workers.values() if w.group.poll() is None]
        supervision.stop_all(live, self.signals, log)
        for worker in self.workers.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.group.wait(timeout=5.0)
            worker.group.join_output(timeout=2.0)

    # --- forming a generation --------------------------------------------------------------------
    def _try_to_form(self) -> int | None:
        first = self.assignment is None
        if not first and not self.survivors:
            return self._fail("every worker failed, so no state is left to go on from")
        need = self.settings.num_proc if first else self.settings.min_np
        available = self.registry.available()
        count = sum(slots for _, slots in available)
        if count < need:
            assert self.waiting_since is not None
            waited = time.monotonic() - self.waiting_since
            if waited > self.settings.timeout:
                return self._fail(
                    f"only {count} slot(s) usable, fewer than the {need} needed "
                    f"({'-np' if first else '--min-np'} {need}), for --elastic-timeout "
                    f"{self.settings.timeout:g} s ({self.registry.describe()}; hosts from "
                    f"{self.discovery.describe()}). HINT: add hosts or slots, lower --min-np, or raise "
                    "--elastic-timeout.")
            return None
        plan = plan_generation(available, list(self.survivors.values()), self.settings.max_np)
        kept = [wid for wid, _ in plan if wid is not None]
        if not first and not kept:
            return self._fail("no surviving worker has a slot in the next generation, so nobody holds the "
                              f"committed state to broadcast ({self.registry.describe()}). HINT: raise "
                              "--max-np, or keep the hosts of the running workers in the discovery output.")
        self.generation += 1
        workers = {}
        new = []
        for wid, slot in plan:
            if wid is None:
                self.next_id += 1
                wid = f"w{self.next_id}"
                new.append((wid, slot))
            workers[wid] = slot
        self.assignment = rdzv.Assignment(self.generation, self.updates, workers)
        self.store.set(rdzv.assignment_key(self.generation), self.assignment.to_json())
        self.store.set(rdzv.CURRENT, str(self.generation))
        for wid, slot in new:
            self._start_worker(wid, slot)
        hosts = ",".join(f"{s.hostname}[{s.local_rank}]" for s in workers.values())
        log(f"generation {self.generation}: {len(workers)} worker(s) on {hosts}" +
            (f"; started {', '.join(w for w, _ in new)}" if new else ""))
        self.survivors = {}
        self.left = set()
        self.left_count = 0
        self.broken_since = None
        self.formed_at = time.monotonic()
        self.joined = set()
        self.failed_hosts = set()
        self.waiting_since = None
        self.notified = None
        self.checked_version = -1
        return None

    # --- a running generation --------------------------------------------------------------------
    def _watch_generation(self) -> int | None:
        assert self.assignment is not None
        members = self.assignment.workers
        g = self.generation
        count = int(self.store.add(rdzv.left_count_key(g), 0))
        if count != self.left_count:
            self.left_count = count
            for wid in members:
                if wid not in self.left and self.store.check([rdzv.left_key(g, wid)]):
                    self.left.add(wid)
        # Only exits _reap has seen count: a failure is recorded before it changes the generation.
        codes = {wid: self.workers[wid].group.poll() if self.workers[wid].reaped else None
                 for wid in members}
        succeeded = [wid for wid, code in codes.items() if code == 0]
        failed = [wid for wid, code in codes.items() if code not in (None, 0)]
        waiting = [wid for wid, code in codes.items() if code is None and wid not in self.left]
        if succeeded:
            return self._finish(codes)
        if (failed or self.left) and self.broken_since is None:
            self.broken_since = time.monotonic()
            reason = (f"worker {failed[0]} failed" if failed
                      else f"worker {sorted(self.left)[0]} left generation {g}")
            self.store.set(rdzv.abort_key(g), reason)
        if self.broken_since is None:
            self._check_joined()
            self._check_host_updates()
            return None
        if waiting:
            if time.monotonic() - self.broken_since > self.settings.timeout:
                for wid in waiting:
                    log(f"worker {wid} did not leave generation {g} within --elastic-timeout "
                        f"{self.settings.timeout:g} s after it broke; killing it")
                    self.workers[wid].group.kill()
            return None
        # Every member has left or exited: re-form.
        if self.settings.reset_limit is not None and self.resets >= self.settings.reset_limit:
            return self._fail(f"the group broke again after --reset-limit {self.settings.reset_limit} "
                              "re-formation(s). HINT: raise --reset-limit, or look at the root cause below.")
        self.resets += 1
        self.survivors = {wid: Survivor(wid, members[wid].hostname, members[wid].local_rank,
                                        members[wid].rank)
                          for wid in self.left if codes[wid] is None}
        self.waiting_since = time.monotonic()
        limit = "" if self.settings.reset_limit is None else f" of at most {self.settings.reset_limit}"
        if failed:
            log(f"generation {g} broke: {len(failed)} worker(s) failed, {len(self.survivors)} wait to go on; "
                f"re-forming the group (reset {self.resets}{limit})")
        else:
            log(f"generation {g} ends: its {len(self.survivors)} worker(s) re-form the group for the changed "
                f"hosts (reset {self.resets}{limit})")
        return None

    def _check_joined(self) -> None:
        """A member that never reaches ``hvd.init()`` would hold the others forever: bounded here."""
        assert self.assignment is not None
        missing = [wid for wid in self.assignment.workers if wid not in self.joined]
        for wid in missing:
            if self.store.check([rdzv.joined_key(self.generation, wid)]):
                self.joined.add(wid)
            elif time.monotonic() - self.formed_at > self.settings.timeout + self.config.start_timeout:
                log(f"worker {wid} did not reach hvd.init() within --start-timeout + --elastic-timeout "
                    f"({self.config.start_timeout:g} + {self.settings.timeout:g} s) of generation "
                    f"{self.generation}; killing it")
                self.workers[wid].group.kill()
                self.joined.add(wid)  # its exit is a failure like any other

    def _check_host_updates(self) -> None:
        """Publish a host update when the usable hosts would change the running generation."""
        if self.registry.version == self.checked_version:
            return
        self.checked_version = self.registry.version
        assert self.assignment is not None
        members = self.assignment.workers
        current = frozenset((s.hostname, s.local_rank) for s in members.values())
        available = self.registry.available()
        desired: frozenset[tuple[str, int]] = frozenset()
        if sum(slots for _, slots in available) >= self.settings.min_np:
            survivors = [Survivor(w, s.hostname, s.local_rank, s.rank) for w, s in members.items()]
            desired = frozenset((s.hostname, s.local_rank)
                                for _, s in plan_generation(available, survivors, self.settings.max_np))
        if desired == current or desired == self.notified:
            return
        self.notified = desired
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
    def _finish(self, codes: Mapping[str, int | None]) -> int | None:
        """A member exited 0: the job is over once every member has exited."""
        if any(code is None for code in codes.values()):
            if any(wid in self.left for wid, code in codes.items() if code is None):
                self.store.set(rdzv.STOP, "a worker finished the job while others waited to re-form")
            return None
        if all(code == 0 for code in codes.values()):
            if self.resets:
                log(f"job finished after {self.resets} re-formation(s) of the group "
                    f"({self.generation} generations)")
            return 0
        return self._fail("")

    def _fail(self, reason: str) -> int:
        if reason:
            log(f"the job stops: {reason}")
        root = earliest(self.failures)
        if root is not None:
            print(format_report(root, len(self.failures), others=self.failures), file=sys.stderr, flush=True)
        elif not reason:
            log("the job failed without a worker failure on record")
        return 1


def launch_elastic(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run ``config.command`` as an elastic job; returns the launcher's exit code (``launch`` checked
    the command already)."""
    driver = ElasticDriver(config, dict(os.environ if environ is None else environ))
    if config.verbose:
        log(f"settings {driver.settings}; hosts from {driver.discovery.describe()}")
    return driver.run()


__all__ = ["DEFAULT_ELASTIC_TIMEOUT", "DISCOVERY_PERIOD", "ElasticDriver", "ElasticSettings",
           "launch_elastic"]
