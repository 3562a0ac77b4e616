"""``horovod.ray.ray_logger``: values a Ray executor's ranks send to the callbacks of ``run``/``execute``,
forwarded to :mod:`ringtrain.ray.ray_logger`."""

from __future__ import annotations

from ringtrain.ray.ray_logger import configure, log

__all__ = ["configure", "log"]
