"""``RayExecutor``: Horovod's fixed-size Ray executor, on ringtrain's engine and job store.

What ``start()`` does, in order: reach the cluster (:mod:`ringtrain.ray.cluster`), reserve a
placement group (``STRICT_SPREAD``, one bundle per host, with ``num_hosts``; ``PACK``, one bundle per
worker, otherwise; or the caller's current group), start one :class:`~ringtrain.ray.worker.RayWorker`
actor per rank in it, number them node by node (:mod:`ringtrain.ray.ranks`), host the job store here
in the driver under a fresh secret, and hand each actor its variables and the secret (as an object
reference, never as an argument that Ray's task listings would show).

A rank that fails stops the whole job: the error names the rank and its node, the other actors are
stopped (they would wait in their collectives until the timeout otherwise), and ``start()`` may be
called again.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringtrain.engine import auth
from ringtrain.engine.store_address import join_address
from ringtrain.ray import cluster, ray_logger
from ringtrain.ray.elastic import ElasticJob, check_elastic
from ringtrain.ray.ranks import RankPlace, WorkerNode, assign_ranks, worker_environ
from ringtrain.ray.settings import RaySettings, create_settings, resources_per_rank
from ringtrain.ray.worker import RayWorker

if TYPE_CHECKING:  # imported where used: job_store imports torch, and every worker actor imports this
    # package (to unpickle RayWorker) whether or not its functions need torch
    from ringtrain.engine import job_store

#: Seconds between checks on the running ranks while waiting for their results.
_POLL_S = 1.0
#: Seconds the other ranks get to report once one failed, so that a rank that died is named as the
#: cause rather than a rank that merely lost its connection to it (Ray learns of a death a bit later).
_ROOT_CAUSE_WAIT_S = 10.0


class WorkerLostError(RuntimeError):
    """A worker actor (a rank) died: its process or its node went away."""


class _StartTimeout(Exception):
    """Some workers did not answer within the start-up timeout."""


class RayExecutor:
    """A fixed-size job whose ranks are Ray actors (Horovod's ``horovod.ray.RayExecutor``).

    ``settings``: from :meth:`create_settings` (None: the defaults). Give either ``num_workers``
    (packed onto as few nodes as fit) or ``num_hosts`` and ``num_workers_per_host`` (exactly that many
    on each of that many nodes). Each worker reserves ``cpus_per_worker`` CPUs and, with
    ``use_gpu``, ``gpus_per_worker`` GPUs (default 1). ``use_current_placement_group``: inside a
    placement group already (a Ray Tune trial, say), put the workers there instead of making one.
    ``address`` (a ringtrain addition): the cluster to join when this process has not called
    ``ray.init`` (default ``RAY_ADDRESS``, else a local cluster).

    Elastic (``min_workers``, with ``max_workers``, ``reset_limit``, ``cooldown_range``,
    ``elastic_timeout``; ``override_discovery`` has no effect): ``start()`` joins the cluster and each
    ``run(fn, args, kwargs)`` is an elastic job of its own whose workers may come and go between
    ``min_workers`` and ``max_workers`` (ray/elastic.py); ``execute`` and ``executable_cls`` are not
    supported there (docs/ray.md).
    """

    create_settings = staticmethod(create_settings)

    def __init__(self, settings: RaySettings | None = None, num_workers: int | None = None,
                 num_hosts: int | None = None, num_workers_per_host: int = 1, cpus_per_worker: float = 1,
                 use_gpu: bool = False, gpus_per_worker: float | None = None,
                 use_current_placement_group: bool = True, min_workers: int | None = None,
                 max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: Sequence[int] | None = None, elastic_timeout: int = 600,
                 override_discovery: bool = True, address: str | None = None) -> None:
        if max_workers is not None and not (min_workers or 0) > 0:
            raise ValueError(f"max_workers={max_workers} needs a positive min_workers (an elastic job). "
                             "HINT: give num_workers for a fixed-size job.")
        if min_workers is not None and num_workers is not None:
            raise ValueError(f"min_workers={min_workers} and num_workers={num_workers}: a job is either "
                             "elastic or fixed-size. HINT: keep num_workers.")
        #: With ``min_workers``: the elastic job that ``start()``/``run()`` drive (ray/elastic.py).
        self._elastic: ElasticJob | None = None
        if min_workers is None and (reset_limit is not None or cooldown_range is not None):
            raise ValueError("reset_limit and cooldown_range are elastic settings: they need min_workers. "
                             "HINT: RayExecutor(settings, min_workers=1, max_workers=4, reset_limit=3).")
        if settings is None:
            settings = create_settings()
        if not isinstance(settings, RaySettings):
            raise TypeError(f"settings={settings!r} is not from RayExecutor.create_settings(). HINT: "
                            "settings = RayExecutor.create_settings(timeout_s=60).")
        if num_hosts is not None and num_workers is not None:
            raise ValueError(f"num_workers={num_workers} and num_hosts={num_hosts}: give one of them. HINT: "
                             "num_workers=8, or num_hosts=2 with num_workers_per_host=4.")
        if num_hosts is not None and min_workers is not None:
            raise ValueError(f"min_workers={min_workers} and num_hosts={num_hosts}: an elastic job puts as "
                             "many workers on each node as its CPUs hold. HINT: leave num_hosts out.")
        if num_hosts is None and num_workers is None and min_workers is None:
            raise ValueError("RayExecutor needs num_workers, or num_hosts with num_workers_per_host. HINT: "
                             "RayExecutor(settings, num_workers=2).")
        for name, value in (("num_workers", num_workers), ("num_hosts", num_hosts),
                            ("num_workers_per_host", num_workers_per_host)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a whole number of at least 1.")
        gpus = resources_per_rank(cpus_per_worker, gpus_per_worker, use_gpu, cpus_name="cpus_per_worker",
                                  gpus_name="gpus_per_worker")
        if min_workers is not None:
            cooldown = check_elastic(min_workers, max_workers, reset_limit, cooldown_range, elastic_timeout,
                                     names=("min_workers", "max_workers"))
            self._elastic = ElasticJob(min_workers, max_workers, reset_limit, cooldown, elastic_timeout,
                                       settings.timeout_s, cpus_per_worker, gpus,
                                       address=address, what="RayExecutor")
        settings.elastic = self._elastic is not None
        self.settings = settings
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.use_gpu = bool(use_gpu)
        self.gpus_per_worker = gpus
        self.use_current_placement_group = use_current_placement_group
        self.address = address
        if min_workers is not None:
            self._size = min_workers
        elif num_hosts is not None:
            self._size = num_hosts * num_workers_per_host
        else:
            assert num_workers is not None  # refused above when all three are None
            self._size = num_workers
        #: The worker actors in rank order (empty until ``start()``).
        self.workers: list[Any] = []
        self._places: list[RankPlace] = []
        self._reservation: cluster.Reservation | None = None
        self._store: job_store.JobStoreServer | None = None

    @property
    def num_workers(self) -> int:
        """The number of ranks."""
        return int(self._size)

    def start(self, executable_cls: type | None = None, executable_args: Sequence[Any] | None = None,
              executable_kwargs: Mapping[str, Any] | None = None,
              extra_env_vars: Mapping[str, Any] | None = None) -> None:
        """Start the workers; each builds ``executable_cls(*executable_args, **executable_kwargs)`` (when
        given) after its environment is set, so the constructor may call ``hvd.init()``.
        ``extra_env_vars`` are set in every worker, after (and over) ringtrain's own.

        Elastic (``min_workers``): joins the cluster only; each :meth:`run` is a job of its own
        (``executable_cls`` is refused: an elastic job has no long-lived workers to hold it)."""
        if self._elastic is not None:
            if executable_cls is not None:
                raise NotImplementedError("an elastic RayExecutor (min_workers) runs functions only: "
                                          "executable_cls is not supported. HINT: build the object inside "
                                          "the function given to run().")
            self._elastic.env_vars.update({str(k): str(v) for k, v in (extra_env_vars or {}).items()})
            self._elastic.start()
            return
        if self.workers:
            raise RuntimeError("this RayExecutor is started already. HINT: call shutdown() first.")
        cluster.connect(self.address, self.settings.timeout_s)
        try:
            self._start_workers(extra_env_vars)
            if executable_cls is not None:
                self._gather([w.start_executable.remote(executable_cls, list(executable_args or ()),
                                                        dict(executable_kwargs or {})) for w in self.workers],
                             "start()")
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, extra_env_vars: Mapping[str, Any] | None) -> None:
        import ray  # the ray extra: imported where used, so that the package loads without it
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cpus, gpus = self.cpus_per_worker, self.gpus_per_worker
        if self.num_hosts is not None:
            per = self.num_workers_per_host
            self._reservation = cluster.reserve(
                {"CPU": cpus * per, "GPU": gpus * per}, self.num_hosts, "STRICT_SPREAD", per,
                self.settings.placement_group_timeout_s, self.use_current_placement_group)
        else:
            self._reservation = cluster.reserve(
                {"CPU": cpus, "GPU": gpus}, self.num_workers, "PACK", 1,
                self.settings.placement_group_timeout_s, self.use_current_placement_group)
        actor: Any = ray.remote(RayWorker)  # an actor class; ray's overloads type it as a function
        created = [
            actor.options(num_cpus=cpus, num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._reservation.group, placement_group_bundle_index=bundle,
                placement_group_capture_child_tasks=False)).remote()
            for bundle in self._reservation.bundles]
        self.workers = created
        nodes = self._startup_get([w.where.remote() for w in created], "report where it runs")
        self._places = assign_ranks(nodes)
        self.workers = [created[p.worker] for p in self._places]
        extra = self._gpu_variables() if self.use_gpu else [{} for _ in self._places]
        host = self._store_host()
        from ringtrain.engine.job_store import JobStoreServer

        secret = auth.new_secret()
        self._store = JobStoreServer(secret, host=host, port=0)
        address = join_address(host, self._store.port) if host != "0.0.0.0" else \
            join_address(ray.util.get_node_ip_address(), self._store.port)
        secret_ref = ray.put(secret)
        environs = [worker_environ(p, address, self.settings.timeout_s, self.settings.nics,
                                   {**extra[i], **dict(extra_env_vars or {})})
                    for i, p in enumerate(self._places)]
        horovod_dir = _horovod_dir()
        self._startup_get([w.join_job.remote(env, [secret_ref], horovod_dir)
                           for w, env in zip(self.workers, environs)], "take the job's environment")

    def _gpu_variables(self) -> list[dict[str, str]]:
        """Every worker sees all GPUs of its node, ordered by local rank, so device ``local_rank`` is its
        own and CUDA can reach its neighbours' devices directly."""
        ids = self._startup_get([w.gpu_ids.remote() for w in self.workers], "report its GPUs")
        by_node: dict[str, list[str]] = {}
        for place, gpu_ids in zip(self._places, ids):
            by_node.setdefault(place.node.node_id, []).extend(g for g in gpu_ids if g not in
                                                              by_node.get(place.node.node_id, []))
        return [{"CUDA_VISIBLE_DEVICES": ",".join(by_node[p.node.node_id])} for p in self._places]

    def _store_host(self) -> str:
        """Where the job store listens: loopback when every rank runs on the driver's node, else the
        address this host uses toward the ranks' nodes (the driver's Ray node address when they differ)."""
        return cluster.store_host(p.node.node_ip for p in self._places)

    def _startup_get(self, refs: list[Any], what: str) -> list[Any]:
        try:
            return self._gather(refs, "start()", timeout_s=self.settings.timeout_s)
        except _StartTimeout:
            raise TimeoutError(
                f"the {len(refs)} Ray worker(s) did not {what} within timeout_s={self.settings.timeout_s:g}. "
                "HINT: check that ringtrain and torch are installed on every Ray node (the same Python "
                "environment), or raise create_settings(timeout_s=...).") from None

    def execute(self, fn: Callable[[Any], Any],
                callbacks: Iterable[Callable[..., Any]] | None = None) -> list[Any]:
        """``fn(executable)`` on every rank; the results in rank order. Each callback is called here
        with every value rank 0 logs meanwhile (:func:`ringtrain.ray.ray_logger.log`)."""
        self._check_started("execute")
        with self._relayed(callbacks):
            return self._gather([w.execute.remote(fn) for w in self.workers], "execute()")

    def run(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
            kwargs: Mapping[str, Any] | None = None,
            callbacks: Iterable[Callable[..., Any]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order (elastic: of the ranks of the
        job's last generation). Each callback is called here with every value rank 0 logs meanwhile
        (:func:`ringtrain.ray.ray_logger.log`)."""
        if self._elastic is not None:
            return self._elastic.run(fn, tuple(args or ()), dict(kwargs or {}),
                                     callbacks=None if callbacks is None else list(callbacks))
        self._check_started("run")
        with self._relayed(callbacks):
            return self._gather(self.run_remote(fn, args, kwargs), "run()")

    def run_remote(self, fn: Callable[..., Any], args: Sequence[Any] | None = None,
                   kwargs: Mapping[str, Any] | None = None,
                   callbacks: Iterable[Callable[..., Any]] | None = None) -> list[Any]:
        """Like :meth:`run`, but returns the object references at once (``ray.get`` them), in rank order.
        ``callbacks`` need the call to be waited for here: pass them to :meth:`run`."""
        if callbacks:
            raise ValueError("run_remote() returns before the ranks run, so nobody would call its callbacks. "
                             "HINT: executor.run(fn, callbacks=[...]).")
        self._check_started("run_remote")
        call = _Call(fn, tuple(args or ()), dict(kwargs or {}))
        return [w.execute.remote(call) for w in self.workers]

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` on rank 0 alone; its result."""
        self._check_started("execute_single")
        return self._gather([self.workers[0].execute.remote(fn)], "execute_single()")[0]

    def shutdown(self) -> None:
        """Stop the workers, remove the placement group this executor made, close the job store."""
        import ray

        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # dead already, or the cluster is gone
                pass
        self.workers = []
        self._places = []
        cluster.release(self._reservation)
        self._reservation = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def _check_started(self, what: str) -> None:
        if self._elastic is not None:
            raise NotImplementedError(f"{what}() is not supported by an elastic RayExecutor (min_workers): "
                                      "its workers live as long as one run(). HINT: use run(fn, args, "
                                      "kwargs).")
        if not self.workers:
            raise RuntimeError(f"{what}() before start(): no workers are running. HINT: call "
                               "executor.start() first (again after a failure or shutdown()).")

    @contextlib.contextmanager
    def _relayed(self, callbacks: Iterable[Callable[..., Any]] | None) -> Iterator[None]:
        """While a call runs, the values its ranks log reach ``callbacks`` here (ray/ray_logger.py); a
        callback's error is raised once the call is over."""
        if not callbacks:
            yield
            return
        import ray

        relay = ray_logger.CallbackRelay(callbacks)
        try:
            ray.get([w.set_queue.remote(relay.queue) for w in self.workers])
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the call's own error is the one to raise
                relay.close()
            raise
        with contextlib.suppress(Exception):  # a worker gone already logs nothing more
            ray.get([w.set_queue.remote(None) for w in self.workers])
        relay.close()

    def _gather(self, refs: list[Any], what: str, timeout_s: float | None = None) -> list[Any]:
        """The results of ``refs`` (one per rank, in rank order). The first rank that fails ends the job:
        its error names the rank and its node, and the other workers are stopped."""
        import ray

        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=wait)
            failed = [ref for ref in done if _failure(ref) is not None]
            if failed:
                self._fail(failed, pending, index, what)
            if pending and deadline is not None and time.monotonic() >= deadline:
                raise _StartTimeout(f"{len(pending)} of {len(refs)} results missing")
        return ray.get(list(refs))

    def _fail(self, failed: list[Any], pending: list[Any], index: dict[Any, int], what: str) -> None:
        """Raise for the root cause among the failed ranks: a rank that died beats the errors of the ranks
        that lost their connection to it, so the others get :data:`_ROOT_CAUSE_WAIT_S` to report too."""
        import ray
        from ray.exceptions import RayActorError

        if pending and not any(isinstance(_failure(ref), RayActorError) for ref in failed):
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=_ROOT_CAUSE_WAIT_S)
            failed += [ref for ref in done if _failure(ref) is not None]
        died = [ref for ref in failed if isinstance(_failure(ref), RayActorError)]
        ref = min(died or failed, key=lambda r: index[r])
        position, error = index[ref], _failure(ref)
        assert error is not None  # every ref in failed holds an error
        where = self._where(position)
        others = sorted(index[r] for r in failed if r is not ref)
        self.shutdown()
        also = f" (rank(s) {', '.join(map(str, others))} failed too)" if others else ""
        if died:
            raise WorkerLostError(
                f"rank {position}{where} died during {what}: {_first_line(error)}{also}. The other ranks "
                "were stopped. HINT: look for that node's failure (out of memory, node lost) in Ray's logs; "
                "call start() to begin again.") from None
        error.add_note(f"ringtrain.ray: raised by rank {position}{where} during {what}{also}; "
                       "the other ranks were stopped.")
        raise error

    def _where(self, position: int) -> str:
        if position >= len(self._places):
            return ""
        node: WorkerNode = self._places[position].node
        return f" on Ray node {node.node_ip} (host {node.hostname}, node id {node.node_id[:12]})"


class _Call:
    """``fn(*args, **kwargs)`` as an ``execute`` function (a class, so that it pickles without a lambda's
    closure over the executor)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, executable: Any) -> Any:
        return self.fn(*self.args, **self.kwargs)


def _failure(ref: Any) -> BaseException | None:
    """The error of a finished ``ref`` (None when it holds a result)."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception as exc:  # the caller sorts actor deaths from the user's errors
        return exc
    return None


def _horovod_dir() -> str | None:
    """The folder this process imported ``horovod`` from (None: not imported here)."""
    module = sys.modules.get("horovod")
    origin = getattr(module, "__file__", None)
    return str(Path(origin).resolve().parent.parent) if origin else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
