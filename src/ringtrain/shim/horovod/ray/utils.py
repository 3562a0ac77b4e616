"""``horovod.ray.utils``: the interfaces Ray Train's ``HorovodTrainer`` hands its workers.

``detect_nics`` returns the interfaces given in the settings (None: the ranks route to the job store, no
probe); ``nics_to_env_var`` turns them into ``GLOO_SOCKET_IFNAME`` (see :mod:`ringtrain.ray.coordinator`).
"""

from __future__ import annotations

from ringtrain.ray.coordinator import detect_nics, nics_to_env_var

__all__ = ["detect_nics", "nics_to_env_var"]
