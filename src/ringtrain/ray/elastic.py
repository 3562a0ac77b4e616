"""Elastic jobs of the Ray executors: ``ElasticRayExecutor`` and ``RayExecutor(min_workers=...)``.

Both run ``fn`` as an elastic job of ``ringtrain run --ray ADDRESS --min-np N --max-np M`` (the elastic
driver over the Ray cluster's living nodes, launch/ray/elastic.py) started as a child process of this
one, on the cluster this process is connected to: a worker lost with its node is replaced from the
cluster's free CPUs, or the job goes on with the workers left while at least the minimum remain;
``hvd.elastic.run`` restores the committed state as with any ``ringtrain run --min-np`` job
(docs/elastic.md). The call travels through a job store hosted here (authenticated with the job's
secret, which the driver hands to each worker on its stdin); each worker of the last generation
stores its result there under its rank, and :meth:`ElasticJob.run` returns them in rank order.

The launcher runs as a command, not an import: ``ringtrain.ray`` sits below ``ringtrain.launch`` in
the package's layers (tests/test_layers.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringtrain.engine import auth
from ringtrain.engine.store_address import join_address
from ringtrain.ray import cluster, ray_logger
from ringtrain.ray.settings import resources_per_rank

#: Lines of the launcher's stderr kept for the error of a failed job.
_TAIL_LINES = 30
#: Keys of the executor's store (ray/elastic_call.py, the workers' side, reads and writes them).
CALL_KEY = "elastic-call/call"
SIZE_KEY = "elastic-call/size"


def result_key(rank: int) -> str:
    return f"elastic-call/result/{rank}"


@dataclass
class ElasticRaySettings:
    """What ``ElasticRayExecutor.create_settings`` was given."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    nics: Any = None
    verbose: int = 1
    override_discovery: bool = True


def _check_count(name: str, value: Any, lowest: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"{name}={value!r} must be a whole number of at least {lowest}.")


def check_elastic(min_np: int, max_np: int | None, reset_limit: int | None,
                  cooldown_range: Sequence[int] | None, elastic_timeout: float,
                  names: tuple[str, str] = ("min_num_proc", "max_num_proc")) -> tuple[int, int] | None:
    """Horovod's checks of an elastic job's settings, with ``names`` for the two counts; the cooldown
    range as a tuple."""
    _check_count(names[0], min_np, 1)
    if max_np is not None:
        _check_count(names[1], max_np, 1)
        if max_np < min_np:
            raise ValueError(f"{names[1]}={max_np} is below {names[0]}={min_np}. HINT: give {names[1]} >= "
                             f"{names[0]}, or leave it out (no upper bound).")
    if reset_limit is not None:
        _check_count("reset_limit", reset_limit, 0)
    if isinstance(elastic_timeout, bool) or not isinstance(elastic_timeout, int | float) \
            or not math.isfinite(elastic_timeout) or elastic_timeout <= 0:
        raise ValueError(f"elastic_timeout={elastic_timeout!r} must be a positive number of seconds.")
    if cooldown_range is None:
        return None
    parts = list(cooldown_range)
    if len(parts) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts) \
            or not 1 <= parts[0] <= parts[1] <= 3600:
        raise ValueError(f"cooldown_range={cooldown_range!r} must be two whole numbers of seconds MIN <= MAX "
                         "within [1, 3600]. HINT: cooldown_range=(10, 300).")
    return parts[0], parts[1]


class ElasticJob:
    """One elastic job description: counts, bounds and each worker's resources (see the module doc)."""

    def __init__(self, min_np: int, max_np: int | None, reset_limit: int | None,
                 cooldown_range: tuple[int, int] | None, elastic_timeout: float, timeout_s: float,
                 cpus_per_worker: float, gpus_per_worker: float, env_vars: Mapping[str, Any] | None = None,
                 address: str | None = None, what: str = "ElasticRayExecutor") -> None:
        self.min_np, self.max_np = min_np, max_np
        self.reset_limit, self.cooldown_range = reset_limit, cooldown_range
        self.elastic_timeout, self.timeout_s = float(elastic_timeout), float(timeout_s)
        self.cpus_per_worker, self.gpus_per_worker = float(cpus_per_worker), float(gpus_per_worker)
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.address = address
        self.what = what
        self.started = False

    def start(self) -> None:
        """Join the Ray cluster (the job itself starts with each :meth:`run`)."""
        cluster.connect(self.address, self.timeout_s)
        self.started = True

    def argv(self, gcs_address: str, store_address: str) -> list[str]:
        """The launcher's command line (no secret on it: that travels in its environment)."""
        argv = [sys.executable, "-m", "ringtrain", "run", "--ray", gcs_address, "-np", str(self.min_np),
                "--min-np", str(self.min_np), "--elastic-timeout", f"{self.elastic_timeout:g}",
                "--start-timeout", f"{self.timeout_s:g}", "--ray-cpus-per-rank", f"{self.cpus_per_worker:g}"]
        if self.max_np is not None:
            argv += ["--max-np", str(self.max_np)]
        if self.reset_limit is not None:
            argv += ["--reset-limit", str(self.reset_limit)]
        if self.cooldown_range is not None:
            argv += ["--blacklist-cooldown-range", str(self.cooldown_range[0]), str(self.cooldown_range[1])]
        if self.gpus_per_worker:
            argv += ["--ray-gpus-per-rank", f"{self.gpus_per_worker:g}"]
        for name in self.env_vars:
            argv += ["-x", name]
        return [*argv, sys.executable, "-m", "ringtrain.ray.elastic_call", store_address]

    def run(self, fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
            callbacks: Sequence[Callable[..., Any]] | None = None) -> list[Any]:
        """``fn(*args, **kwargs)`` as an elastic job; the results of the last generation, in rank order.
        Each callback is called here with every value the ranks log meanwhile (ray/ray_logger.py)."""
        import cloudpickle
        import ray

        if not self.started:
            raise RuntimeError(f"{self.what}.run() before start(). HINT: call executor.start() first.")
        # here, not at the top: job_store imports torch, and every worker actor imports this package
        from ringtrain.engine import job_store

        secret = auth.new_secret()
        server = job_store.JobStoreServer(secret, host="0.0.0.0", port=0)
        store = job_store.JobStore(join_address("127.0.0.1", server.port), secret, timeout=60.0)
        try:
            store.set(CALL_KEY, cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))))
            here = ray.util.get_node_ip_address()
            argv = self.argv(ray.get_runtime_context().gcs_address, join_address(here, server.port))
            env = {**os.environ, **self.env_vars, auth.ENV_SECRET: secret}
            relay = ray_logger.StoreRelay(store, callbacks) if callbacks else None
            try:
                code, tail = _run_launcher(argv, env)
            finally:
                if relay is not None and sys.exc_info()[0] is not None:
                    with contextlib.suppress(Exception):  # the launcher's own error is the one to raise
                        relay.close()
            if relay is not None:
                relay.close()
            if code != 0:
                raise RuntimeError(
                    f"{self.what}: the elastic job failed (exit code {code}; min {self.min_np}, max "
                    f"{self.max_np if self.max_np is not None else 'unbounded'} workers, elastic_timeout "
                    f"{self.elastic_timeout:g} s). The launcher's last words:\n" + "".join(tail))
            size = int(store.get(SIZE_KEY))
            return [cloudpickle.loads(store.get(result_key(rank))) for rank in range(size)]
        finally:
            store.close()
            server.close()


def _run_launcher(argv: list[str], env: Mapping[str, str]) -> tuple[int, list[str]]:
    """Run the launcher with its output on this process's; its exit code and the tail of its stderr."""
    proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    tail: list[str] = []

    def relay() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line)
            del tail[:-_TAIL_LINES]

    reader = threading.Thread(target=relay, name="ringtrain-elastic-ray-stderr", daemon=True)
    reader.start()
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C here: the launcher stops its workers on SIGINT
        proc.terminate()
        proc.wait()
        raise
    reader.join()
    return code, tail


class ElasticRayExecutor:
    """Horovod's elastic Ray executor: ``start()``, then ``run(worker_fn)`` returns the result of every
    worker of the job's last generation, in rank order. ``worker_fn`` takes no arguments and usually
    runs an ``@hvd.elastic.run`` training function (see the module doc).

    ``cpus_per_slot`` / ``gpus_per_slot`` (with ``use_gpu``): what each worker reserves; a Ray node
    holds as many workers as its CPUs (and GPUs) fit. ``env_vars``: set in every worker.
    ``override_discovery`` is accepted and has no effect (the cluster's nodes are always the hosts).
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None,
                        cooldown_range: tuple[int, int] | None = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: str | None = None, nics: Any = None,
                        verbose: int = 1, **_ignored: Any) -> ElasticRaySettings:
        """Settings of an elastic job (``ssh_identity_file`` and other ssh options are ignored)."""
        cooldown = check_elastic(min_num_proc, max_num_proc, reset_limit, cooldown_range, elastic_timeout)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r} must be a positive number of seconds.")
        return ElasticRaySettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                                  reset_limit=reset_limit,
                                  cooldown_range=cooldown, elastic_timeout=elastic_timeout,
                                  timeout_s=timeout_s, nics=nics, verbose=verbose)

    def __init__(self, settings: ElasticRaySettings | None = None, env_vars: dict[str, str] | None = None,
                 use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float | None = None,
                 override_discovery: bool = True, address: str | None = None, **_ignored: Any) -> None:
        if settings is None:
            settings = self.create_settings()
        if not isinstance(settings, ElasticRaySettings):
            raise TypeError(f"settings={settings!r} is not from ElasticRayExecutor.create_settings(). HINT: "
                            "ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=4).")
        gpus = resources_per_rank(cpus_per_slot, gpus_per_slot, use_gpu, cpus_name="cpus_per_slot",
                                  gpus_name="gpus_per_slot")
        self.settings = settings
        self._job = ElasticJob(settings.min_num_proc, settings.max_num_proc, settings.reset_limit,
                               settings.cooldown_range, settings.elastic_timeout, settings.timeout_s,
                               cpus_per_slot, gpus, env_vars, address)

    def start(self) -> None:
        """Join the Ray cluster (``RAY_ADDRESS``, else a local one, unless connected already)."""
        self._job.start()

    def run(self, worker_fn: Callable[[], Any], callbacks: Sequence[Callable[..., Any]] | None = None
            ) -> list[Any]:
        """``worker_fn()`` in every worker of an elastic job; the last generation's results in rank order.
        Each callback is called here with every value rank 0 logs meanwhile
        (:func:`ringtrain.ray.ray_logger.log`, Horovod's ``horovod.ray.ray_logger.log``)."""
        return self._job.run(worker_fn, callbacks=callbacks)
