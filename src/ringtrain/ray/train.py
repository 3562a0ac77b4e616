"""Horovod-style training functions under Ray Train V2: a backend config and a ``HorovodTrainer`` for it.

Ray 2.60's Train V2 refuses its own ``HorovodTrainer`` (``ray/train/v2/horovod/horovod_trainer.py``
raises in its constructor), but its ``DataParallelTrainer`` takes any ``BackendConfig``: the backend's
``on_start`` runs in Train's controller once the workers are up and may run functions on them. This
module's backend numbers nothing itself (Ray Train's worker ``i`` is rank ``i``); it asks each worker
where it runs, hosts the job store in the controller under a fresh secret and gives every worker the
variables :class:`~ringtrain.ray.RayExecutor` gives its actors, so ``hvd.init()`` (``import
horovod.torch as hvd`` through the shim, or ``import ringtrain as hvd``) joins the job::

    from ray.train import ScalingConfig
    from ringtrain.ray.train import HorovodTrainer

    trainer = HorovodTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2))
    result = trainer.fit()

The secret reaches the workers as a Ray object reference that each worker reads itself, as with
``RayExecutor``. Needs ``ray[train]`` (``pip install 'ringtrain[ray]'``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

try:
    import ray
    from ray.train.backend import Backend, BackendConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"ringtrain.ray.train needs Ray Train, which is not installed ({exc}). HINT: pip "
                      "install 'ringtrain[ray]' (ray[train]>=2.9) into this environment.") from None

from ringtrain.engine import job_store
from ringtrain.ray.coordinator import DEFAULT_TIMEOUT_S, detect_nics, open_job_store
from ringtrain.ray.ranks import WorkerNode, places_of_ranks, worker_environ
from ringtrain.ray.worker import RayWorker


@dataclass
class RingtrainConfig(BackendConfig):
    """``timeout_s``: the ranks' ``hvd.init()`` timeout; ``nics``: the interfaces the ranks use among
    themselves (``GLOO_SOCKET_IFNAME``; None: each rank routes to the job store)."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    nics: set[str] | None = None

    def __post_init__(self) -> None:
        timeout_s = self.timeout_s
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a positive number of seconds. HINT: "
                             "RingtrainConfig(timeout_s=300).")
        detect_nics(self)  # checks the names

    @property
    def backend_cls(self) -> type[Backend]:
        return _RingtrainBackend


class _RingtrainBackend(Backend):
    # every worker sees all GPUs of its node, as with RayExecutor: device local_rank is its own
    share_cuda_visible_devices: bool = True
    _server: job_store.JobStoreServer | None = None

    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        # Ray Train passes the config whose backend_cls this is
        assert isinstance(backend_config, RingtrainConfig)
        nodes: list[WorkerNode] = worker_group.execute(_where)
        places = places_of_ranks(nodes)
        self._close()
        self._server, address, secret = open_job_store(node.node_ip for node in nodes)
        secret_ref = ray.put(secret)
        nics = sorted(detect_nics(backend_config) or ())
        ray.get([worker_group.execute_single_async(
            place.rank, _join, worker_environ(place, address, backend_config.timeout_s, nics), [secret_ref])
            for place in places])

    def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
        self._close()

    def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def _where() -> WorkerNode:
    return RayWorker().where()


def _join(environ: dict[str, str], secret: list[Any]) -> None:
    RayWorker().join_job(environ, secret)


class HorovodTrainer(DataParallelTrainer):
    """Train V2's data-parallel trainer with :class:`RingtrainConfig`: Ray Train V1's ``HorovodTrainer``
    arguments, ``horovod_config`` being a :class:`RingtrainConfig` (None: the defaults)."""

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: dict | None = None,
                 horovod_config: RingtrainConfig | None = None, scaling_config: Any = None,
                 run_config: Any = None, datasets: dict[str, Any] | None = None, dataset_config: Any = None,
                 **kwargs: Any) -> None:
        if horovod_config is not None and not isinstance(horovod_config, RingtrainConfig):
            raise TypeError(f"horovod_config={horovod_config!r} is not a ringtrain.ray.train.RingtrainConfig."
                            " HINT: RingtrainConfig(timeout_s=..., nics=...); Ray's HorovodConfig belongs to "
                            "Train V1 (RAY_TRAIN_V2_ENABLED=0 with ray.train.horovod.HorovodTrainer).")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=horovod_config or RingtrainConfig(), scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config, **kwargs)


__all__ = ["HorovodTrainer", "RingtrainConfig"]
