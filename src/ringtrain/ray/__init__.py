"""Horovod's ``horovod.ray`` API on ringtrain: a job's ranks as Ray actors (docs/ray.md).

``RayExecutor`` places ``num_workers`` actors in a placement group, numbers them node by node, gives
each the environment ``hvd.init()`` reads (ringtrain's authenticated job store, hosted by the driver)
and runs functions or a stateful executable on all of them::

    import ray
    from ringtrain.ray import RayExecutor

    ray.init()
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2)
    executor.start()
    ranks = executor.run(train_fn)        # one result per rank, in rank order
    executor.shutdown()

Ray Train: :mod:`ringtrain.ray.coordinator` is what Ray Train V1's ``HorovodTrainer`` calls through
the shim's ``horovod.ray.runner``; :mod:`ringtrain.ray.train` is a backend and a ``HorovodTrainer`` for
Train V2 (imported on its own: it needs ``ray.train``).

Ray is an optional dependency (``pip install 'ringtrain[ray]'``); importing this package without it
raises one ImportError that says so.
"""

from __future__ import annotations

try:
    import ray as _ray  # noqa: F401 - only to fail early with the install hint
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("ringtrain.ray needs Ray, which is not installed. HINT: pip install 'ringtrain[ray]' "
                      f"(ray>=2.9) into this environment ({exc}).") from None

from ringtrain.ray.elastic import ElasticRayExecutor
from ringtrain.ray.executor import RayExecutor
from ringtrain.ray.settings import RaySettings
from ringtrain.ray.worker import RayWorker

__all__ = ["ElasticRayExecutor", "RayExecutor", "RaySettings", "RayWorker"]
