"""Where an elastic job's workers run: the :class:`Backend` interface.

The elastic driver (:mod:`ringtrain.launch.elastic_driver`) knows no backend by name. It asks its backend
for the hosts and their slots (:meth:`Backend.find`, every second), starts each worker through it
(:meth:`Backend.start_worker`, which also delivers the worker's environment and the job's secret its own
way), beats at its interval and, at the end, lets it release what it reserved. The backends:
:class:`ringtrain.launch.hosts_backend.HostsBackend` (this machine and ssh hosts) and
:class:`ringtrain.launch.ray.elastic.RayHosts` (the living Ray nodes, one actor per worker), chosen by
:func:`ringtrain.launch.backends.select_backend`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ringtrain.engine.auth import ENV_SECRET
from ringtrain.launch import supervision
from ringtrain.launch.elastic_worker import ENV_SECRET_ON_STDIN
from ringtrain.launch.remote import forwarded_environment

#: Variables of an enclosing launcher that must not leak into workers (their rank comes from the driver).
FOREIGN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
           "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def log(message: str) -> None:
    """One line of the elastic driver's (and its backends') on stderr."""
    print(f"ringtrain elastic: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class WorkerStart:
    """One worker the driver asks its backend to start."""

    wid: str
    host: str
    rank: int
    argv: Sequence[str]
    #: The driver's variables for this worker (its slot, the job store's address, the launcher's knobs).
    ours: Mapping[str, str]
    #: The driver's own environment (what a worker on this machine inherits).
    environ: Mapping[str, str]
    secret: str = field(repr=False)
    lock: threading.Lock
    #: Seconds of silence after which the worker is given up (its heartbeats' limit).
    silence_limit: float
    #: Seconds between the driver's heartbeats (the worker beats back as often).
    beat_interval: float
    #: ``--verbose``: say where each worker started.
    verbose: bool = False


class Backend(Protocol):
    """The hosts an elastic job may use and how a worker starts on one of them."""

    def describe(self) -> str:
        """Where the hosts come from, for the driver's messages."""
        ...

    def find(self) -> dict[str, int]:
        """``{host: slots}`` usable now (``DiscoveryError`` when they cannot be learned)."""
        ...

    def listens_beyond_loopback(self) -> bool:
        """Whether the job store must listen on every interface (a worker may run on another machine)."""
        ...

    def beat_interval(self, peer_timeout: float) -> float:
        """Seconds between the driver's heartbeats to a worker, for the silence limit ``peer_timeout``."""
        ...

    def start_worker(self, start: WorkerStart) -> supervision.RankGroup:
        """Start one worker; its environment and the job's secret reach it as this backend delivers them."""
        ...

    def not_started_text(self, wid: str, group: supervision.RankGroup) -> str:
        """Why a worker that never reached the job store ended, in the backend's words."""
        ...

    def hosts_changed(self, group: supervision.RankGroup) -> bool:
        """After ``group`` failed: whether the hosts are known to have changed, so the driver asks
        :meth:`find` now instead of at the discovery's next round."""
        ...

    def release(self) -> None:
        """Give back what the job reserved (the job is over)."""
        ...


def without_enclosing_launcher(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without an enclosing launcher's rank variables (:data:`FOREIGN`) and torch's elastic
    agent's (``TORCHELASTIC_*``): a worker's rank and agent come from this driver."""
    return {k: v for k, v in environ.items() if k not in FOREIGN and not k.startswith("TORCHELASTIC_")}


def remote_environment(start: WorkerStart, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A worker's variables for a place that is not this process's child: the launcher's own that
    travel (launch/remote.py) and the driver's, without the secret (it goes on the worker's stdin) and
    without an enclosing launcher's rank variables."""
    sent = {**start.ours, ENV_SECRET_ON_STDIN: "1", **(extra or {})}
    forwarded = forwarded_environment(start.environ, sent)
    forwarded.pop(ENV_SECRET, None)
    return without_enclosing_launcher(forwarded)


__all__ = ["FOREIGN", "Backend", "WorkerStart", "log", "remote_environment", "without_enclosing_launcher"]
