"""``horovod.ray.runner``: the executor and the ``Coordinator`` Ray Train's ``HorovodTrainer`` uses.

Both forward to :mod:`ringtrain.ray`: the Coordinator registers Ray Train's workers and hosts their
rendezvous on a ringtrain job store (docs/ray.md, "Ray Train").
"""

from __future__ import annotations

from ringtrain.ray import RayExecutor
from ringtrain.ray.coordinator import Coordinator

__all__ = ["Coordinator", "RayExecutor"]
