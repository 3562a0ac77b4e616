"""The worker side of an elastic job: which generation to join, this worker's place in it, host updates.

``ringtrain run --min-np/--max-np/--host-discovery-script`` (:mod:`ringtrain.launch.elastic_driver`)
starts every worker with these variables:

- ``RINGTRAIN_ELASTIC_WORKER``: the worker's id (``w3``), unique for the whole job;
- ``RINGTRAIN_ELASTIC_GENERATION``: the generation the worker was started for;
- ``RINGTRAIN_JOB_STORE`` / ``RINGTRAIN_JOB_SECRET``: the driver's job store and the job's secret.

A *generation* is one formation of the group. For each one the driver publishes an
:class:`Assignment` in the job store: rank, size, local and cross rank/size and host name of every
worker in it. ``hvd.init()`` of an elastic worker calls :func:`join` (through
``engine.world_rendezvous.rendezvous``): it tells the driver that this worker has left the generation
it was in (after a failure or a host update), waits for the next one, takes its rank and size from there (not
from RANK / WORLD_SIZE variables) and hands the engine a store whose keys all live under that
generation's prefix, so a re-formed group never reads an older generation's addresses.

The driver marks a generation *abandoned* when one of its workers dies or leaves; every blocking
wait of the engine's store in that generation then fails at once (instead of at the gloo timeout),
and ``init()`` moves on to the next generation.

Host updates (hosts added by the discovery script, or removed) reach the workers through numbered
keys; :func:`add_listener` registers a callback (``State.on_hosts_updated``) that a background thread
calls for each update newer than the current generation.

Keys, all in the driver's job store (the layout is this module's, the driver uses the same functions)::

    elastic/current                    the newest generation published (decimal)
    elastic/gen/<g>/assignment         its Assignment (JSON)
    elastic/gen/<g>/abort              set when generation g broke: the reason
    elastic/gen/<g>/joined/<worker>    the worker reached hvd.init() and took its place in g
    elastic/gen/<g>/left/<worker>      the worker left g and waits for the next generation
    elastic/gen/<g>/left               how many workers left g (a counter the driver polls)
    elastic/gen/<g>/engine/...         the engine's own keys for generation g
    elastic/update/<n>                 host update n: {"timestamp": ..., "result": 1 removed | 2 added}
    elastic/worker/<worker>/alive      the worker process started and reached the store
    elastic/stop                       the job is over: workers waiting for a generation exit
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch.distributed as dist

from ringtrain.engine import job_store
from ringtrain.exceptions import ElasticWorkerExit, JobStoreError

if TYPE_CHECKING:
    from ringtrain.engine.world_rendezvous import World

ENV_WORKER = "RINGTRAIN_ELASTIC_WORKER"
ENV_GENERATION = "RINGTRAIN_ELASTIC_GENERATION"

CURRENT = "elastic/current"
STOP = "elastic/stop"
#: How host updates are named in the log (Horovod's HostUpdateResult flags).
_CHANGES = {1: "removed", 2: "added", 3: "added and removed"}
#: Longest a blocking wait goes without looking at the abort and stop keys (seconds).
POLL_SECONDS = 1.0


def assignment_key(generation: int) -> str:
    return f"elastic/gen/{generation}/assignment"


def abort_key(generation: int) -> str:
    return f"elastic/gen/{generation}/abort"


def left_key(generation: int, worker: str) -> str:
    return f"elastic/gen/{generation}/left/{worker}"


def joined_key(generation: int, worker: str) -> str:
    return f"elastic/gen/{generation}/joined/{worker}"


def left_count_key(generation: int) -> str:
    return f"elastic/gen/{generation}/left"


def engine_prefix(generation: int) -> str:
    """The engine's namespace in generation ``generation`` (PrefixStore adds the "/" itself)."""
    return f"elastic/gen/{generation}/engine"


def update_key(number: int) -> str:
    return f"elastic/update/{number}"


def alive_key(worker: str) -> str:
    return f"elastic/worker/{worker}/alive"


@dataclass(frozen=True)
class Slot:
    """One worker's place in a generation (Horovod's SlotInfo)."""

    hostname: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int

    def horovod_variables(self) -> dict[str, str]:
        """The ``HOROVOD_*`` variables of this place (horovodrun's names; scripts read them)."""
        return {"HOROVOD_HOSTNAME": self.hostname, "HOROVOD_RANK": str(self.rank),
                "HOROVOD_SIZE": str(self.size), "HOROVOD_LOCAL_RANK": str(self.local_rank),
                "HOROVOD_LOCAL_SIZE": str(self.local_size), "HOROVOD_CROSS_RANK": str(self.cross_rank),
                "HOROVOD_CROSS_SIZE": str(self.cross_size)}


@dataclass(frozen=True)
class Assignment:
    """A generation: every worker's :class:`Slot`, and how many host updates it already includes."""

    generation: int
    updates: int
    workers: Mapping[str, Slot]

    @property
    def size(self) -> int:
        return len(self.workers)

    def to_json(self) -> str:
        return json.dumps({"generation": self.generation, "updates": self.updates,
                           "workers": {w: asdict(s) for w, s in self.workers.items()}})

    @classmethod
    def from_json(cls, text: str | bytes) -> Assignment:
        body = json.loads(text)
        return cls(generation=int(body["generation"]), updates=int(body["updates"]),
                   workers={w: Slot(**s) for w, s in body["workers"].items()})


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """True in a worker started by ringtrain's elastic driver."""
    environ = os.environ if environ is None else environ
    return bool(environ.get(ENV_WORKER, "").strip())


class GenerationStore(dist.Store):
    """The job store as one generation's engine sees it: blocking waits give up once it is abandoned.

    gloo and the control plane wait for their peers' keys; when a peer of this generation died
    before publishing them, the driver sets the generation's abort key and the wait fails within
    :data:`POLL_SECONDS`, naming the reason.
    """

    def __init__(self, base: job_store.JobStore, generation: int, timeout_s: float) -> None:
        super().__init__()
        self._base = base
        self._generation = generation
        self.set_timeout(datetime.timedelta(seconds=timeout_s))

    def _wait(self, keys: list[str], timeout: datetime.timedelta | None) -> None:
        # torch's stubs leave out Store.timeout, the property set_timeout sets
        default: datetime.timedelta = self.timeout  # type: ignore[attr-defined]
        limit = (default if timeout is None else timeout).total_seconds()
        deadline = None if limit <= 0 else time.monotonic() + limit
        abort = abort_key(self._generation)
        while not self._base.check(keys):
            if self._base.check([abort]):
                reason = self._base.get(abort).decode(errors="replace")
                raise dist.DistStoreError(f"generation {self._generation} of the elastic job was abandoned "
                                          f"while waiting for {keys}: {reason}")
            left = POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - time.monotonic())
            if left < 0.001:  # the job store reads a wait under 1 ms as "no timeout"
                raise dist.DistStoreError(f"timed out after {limit:g} s waiting for {keys} in generation "
                                          f"{self._generation} of the elastic job")
            try:
                self._base.wait(keys, datetime.timedelta(seconds=left))
            except dist.DistStoreError:
                continue

    def set(self, key: str, value: str | bytes) -> None:
        self._base.set(key, value)

    def get(self, key: str) -> bytes:
        self._wait([key], None)
        return self._base.get(key)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._wait(list(keys), timeout)

    def add(self, key: str, value: int) -> int:
        return self._base.add(key, value)

    def compare_set(self, key: str, expected_value: str | bytes, desired_value: str | bytes) -> bytes:
        return self._base.compare_set(key, expected_value, desired_value)

    def check(self, keys: list[str]) -> bool:
        return self._base.check(keys)

    def delete_key(self, key: str) -> bool:
        return self._base.delete_key(key)

    def num_keys(self) -> int:
        return self._base.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self._wait(list(keys), None)
        return self._base.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[str | bytes]) -> None:
        self._base.multi_set(keys, values)

    def append(self, key: str, value: str | bytes) -> None:
        self._base.append(key, value)


class WorkerClient:
    """This worker's connection to the driver: the generation it is in, and the update listener.

    One per process (:func:`join` makes it from the environment); tests build their own.
    """

    def __init__(self, worker: str, store: job_store.JobStore, first_generation: int) -> None:
        self.worker = worker
        self.store = store
        self.first_generation = first_generation
        #: The generation this worker is in (0: none yet).
        self.generation = 0
        self.rank = -1
        #: Host updates numbered up to this one are part of the current generation already.
        self.updates_seen = 0
        # Every generation's store stays referenced: C++ (PrefixStore, gloo) does not keep it alive.
        self._stores: list[GenerationStore] = []
        self._listeners: list[Callable[[float, int], None]] = []
        #: Every host update heard so far: (number, timestamp, result).
        self._updates: list[tuple[int, float, int]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def join(self, timeout_s: float) -> World:
        from ringtrain.engine.world_rendezvous import World

        if self.generation:
            # What the driver waits for before it re-forms the group: every member has left or exited.
            self.store.set(left_key(self.generation, self.worker), "1")
            self.store.add(left_count_key(self.generation), 1)
            target = self.generation + 1
        else:
            target = self.first_generation
        assignment = self._wait_for(target)
        self.generation = assignment.generation
        slot = assignment.workers.get(self.worker)
        if slot is None:
            raise ElasticWorkerExit(
                f"ringtrain elastic: worker {self.worker} has no place in generation {assignment.generation} "
                f"(its host was removed or blacklisted, or the group is at --max-np); it exits.", 0)
        self.updates_seen = assignment.updates
        self.rank = slot.rank
        self.store.set(joined_key(assignment.generation, self.worker), "1")
        os.environ.update(slot.horovod_variables())
        base = GenerationStore(self.store, assignment.generation, timeout_s)
        self._stores.append(base)
        host, _ = job_store.split_address(self.store.address)
        return World(rank=slot.rank, size=slot.size, local_rank=slot.local_rank, local_size=slot.local_size,
                     cross_rank=slot.cross_rank, cross_size=slot.cross_size, hostname=slot.hostname,
                     store=dist.PrefixStore(engine_prefix(assignment.generation), base),
                     reused_torch_world=False, main_address=host, secret=getattr(self.store, "secret", None),
                     scope=engine_prefix(assignment.generation))

    def _wait_for(self, target: int) -> Assignment:
        """The assignment of generation ``target`` (or a newer one), once the driver publishes it."""
        while True:
            if self.store.check([STOP]):
                reason = self.store.get(STOP).decode(errors="replace")
                raise ElasticWorkerExit(f"ringtrain elastic: the job is stopping ({reason}); worker "
                                        f"{self.worker} exits.", 1)
            current = int(self.store.get(CURRENT)) if self.store.check([CURRENT]) else 0
            if current >= target:
                return Assignment.from_json(self.store.get(assignment_key(current)))
            try:
                self.store.wait([assignment_key(target)], datetime.timedelta(seconds=POLL_SECONDS))
            except dist.DistStoreError:
                continue

    # --- host updates ----------------------------------------------------------------------------
    def add_listener(self, callback: Callable[[float, int], None]) -> None:
        with self._lock:
            self._listeners.append(callback)
            if self._thread is None:
                self._thread = threading.Thread(target=self._listen, name="ringtrain-elastic-updates",
                                                daemon=True)
                self._thread.start()

    def remove_listener(self, callback: Callable[[float, int], None]) -> None:
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def pending_updates(self) -> list[tuple[float, int]]:
        """Updates heard that the current generation does not include yet: ``(timestamp, result)``."""
        with self._lock:
            return [(ts, result) for number, ts, result in self._updates if number > self.updates_seen]

    def _listen(self) -> None:
        try:
            connection = self.store.clone()
        except (JobStoreError, OSError):
            return
        number = self.updates_seen + 1
        while True:
            try:
                connection.wait([update_key(number)], datetime.timedelta(seconds=5 * POLL_SECONDS))
            except dist.DistStoreError:
                continue
            except (JobStoreError, OSError):
                return  # the driver is gone; the engine reports that on its own
            try:
                update = json.loads(connection.get(update_key(number)))
            except (JobStoreError, OSError, ValueError):
                return
            with self._lock:
                self._updates.append((number, float(update["timestamp"]), int(update["result"])))
            if number > self.updates_seen:
                with self._lock:
                    listeners = list(self._listeners)
                if listeners and self.rank == 0:
                    change = _CHANGES.get(int(update["result"]), "changed")
                    print(f"ringtrain elastic: hosts {change}; the group re-forms at the next commit",
                          file=sys.stderr, flush=True)
                for callback in listeners:
                    callback(float(update["timestamp"]), int(update["result"]))
            number += 1


_client: WorkerClient | None = None


def _get_client(timeout_s: float) -> WorkerClient:
    global _client
    if _client is None:
        address = job_store.address_from_environ(os.environ)
        if address is None:
            raise ValueError(f"{ENV_WORKER} is set but {job_store.ENV_ADDRESS} is not, so this elastic "
                             "worker cannot find its driver. HINT: start elastic jobs with ringtrain run "
                             "--min-np/--max-np/--host-discovery-script, and do not set "
                             f"{ENV_WORKER} by hand.")
        store = job_store.JobStore(address, job_store.secret_from_environ(os.environ), timeout=timeout_s)
        try:
            first = int(os.environ.get(ENV_GENERATION, "1"))
        except ValueError:
            first = 1
        _client = WorkerClient(os.environ[ENV_WORKER].strip(), store, first)
    return _client


def join(timeout_s: float) -> World:
    """Leave the current generation (if any), wait for the next and return this worker's place in it.

    Raises :class:`~ringtrain.exceptions.ElasticWorkerExit` when the new generation has no place for
    this worker or the job is stopping.
    """
    return _get_client(timeout_s).join(timeout_s)


def add_listener(callback: Callable[[float, int], None]) -> bool:
    """Call ``callback(timestamp, result)`` for every host update after the current generation formed.

    False (and nothing registered) outside an elastic job or before ``hvd.init()``.
    """
    if _client is None or not _client.generation:
        return False
    _client.add_listener(callback)
    return True


def pending_updates() -> list[tuple[float, int]]:
    """Host updates newer than the current generation (``State.on_reset`` keeps them: one that arrived
    while this worker re-initialized must still interrupt the next commit)."""
    return [] if _client is None else _client.pending_updates()


def remove_listener(callback: Callable[[float, int], None]) -> None:
    """Stop calling ``callback``."""
    if _client is not None:
        _client.remove_listener(callback)


__all__ = ["CURRENT", "ENV_GENERATION", "ENV_WORKER", "POLL_SECONDS", "STOP", "Assignment", "GenerationStore",
           "Slot", "WorkerClient",
           "abort_key", "add_listener", "alive_key", "assignment_key", "enabled", "engine_prefix", "join",
           "joined_key", "left_count_key", "left_key", "pending_updates", "remove_listener", "update_key"]
