"""``RayExecutor.create_settings``: the few settings a Ray job has, checked once.

Horovod's version also took ssh options, because its Ray driver could fall back to ssh; here Ray
itself carries everything to the workers, so ``ssh_identity_file`` and ``ssh_str`` are accepted for
old scripts and ignored (``ssh_str``, a private key, is never written anywhere).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RaySettings:
    """What ``RayExecutor`` needs besides the worker counts.

    ``timeout_s``: how long the workers wait for each other in ``hvd.init()`` (their
    ``HOROVOD_GLOO_TIMEOUT_SECONDS``), and how long the driver waits to reach a Ray cluster or for its
    workers to start. ``placement_group_timeout_s``: how long the placement group may take to fit on
    the cluster before ``start()`` gives up. ``nics``: network interfaces the ranks use among
    themselves (their ``GLOO_SOCKET_IFNAME``); None lets each rank route to the job store's address.
    """

    timeout_s: float = 30
    placement_group_timeout_s: float = 100
    nics: tuple[str, ...] | None = None
    #: Accepted for Horovod's scripts and ignored (Ray starts the workers, not ssh).
    ssh_identity_file: str | None = None
    #: Set by the executor: whether the job is elastic (Horovod's settings carried the same flag).
    elastic: bool = False
    #: Ignored as above; kept out of repr so that a printed settings object never shows a key.
    ssh_str: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_group_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive number of seconds. "
                                 f"HINT: RayExecutor.create_settings({name}=60).")
        if self.nics is not None:
            self.nics = _interface_names(self.nics)


def _interface_names(nics: str | Iterable[str]) -> tuple[str, ...]:
    names = nics.split(",") if isinstance(nics, str) else list(nics)
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"nics={nics!r} must name network interfaces, e.g. {{'eth0'}}. HINT: leave it out "
                         "to let the ranks pick the route to the driver.")
    return tuple(sorted({n.strip() for n in names}))


def create_settings(timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                    placement_group_timeout_s: float = 100,
                    nics: str | Iterable[str] | None = None) -> RaySettings:
    """Settings for :class:`~ringtrain.ray.RayExecutor` (see :class:`RaySettings`)."""
    return RaySettings(timeout_s=timeout_s, placement_group_timeout_s=placement_group_timeout_s,
                       nics=None if nics is None else _interface_names(nics),
                       ssh_identity_file=ssh_identity_file, ssh_str=ssh_str)


def resources_per_rank(cpus: Any, gpus: Any, use_gpu: bool, *, cpus_name: str, gpus_name: str) -> float:
    """Check the CPUs and GPUs an executor is to reserve for each rank (named as its caller names them);
    returns the GPUs: 0 without ``use_gpu``, 1 where ``use_gpu`` comes without a number."""
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or cpus <= 0:
        raise ValueError(f"{cpus_name}={cpus!r} must be a positive number of CPUs.")
    if gpus is not None and not use_gpu:
        raise ValueError(f"{gpus_name}={gpus} without use_gpu=True reserves no GPU. HINT: add use_gpu=True, "
                         f"or leave {gpus_name} out.")
    if not use_gpu:
        return 0
    reserved = 1 if gpus is None else gpus
    if isinstance(reserved, bool) or not isinstance(reserved, int | float) or reserved <= 0:
        raise ValueError(f"{gpus_name}={gpus!r} must be a positive number of GPUs.")
    return reserved
