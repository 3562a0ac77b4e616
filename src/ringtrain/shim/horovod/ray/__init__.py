"""``horovod.ray``: Horovod's Ray executor, forwarded to :mod:`ringtrain.ray` (docs/ray.md).

Importing it without Ray installed raises ringtrain's ImportError, which names ``pip install
'ringtrain[ray]'``.
"""

from __future__ import annotations

from ringtrain.ray import ElasticRayExecutor, RayExecutor
from ringtrain.ray import RayWorker as BaseHorovodWorker

__all__ = ["BaseHorovodWorker", "ElasticRayExecutor", "RayExecutor"]
