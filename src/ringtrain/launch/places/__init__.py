"""The places a driver can start a group of ranks on, by name: one module each, one entry each here.

A new backend (Ray actors, Kubernetes pods, ...) is a module that implements
:class:`ringtrain.launch.supervision.RankGroup` (or subclasses
:class:`~ringtrain.launch.supervision.ProcessGroup` when a child process of the driver stands for the
group, :class:`~ringtrain.launch.supervision.RelayedGroup` when only its output comes here, as Ray's)
and one line in :data:`PLACES`; docs/architecture.md walks through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from ringtrain.launch.places.local import LocalGroup
from ringtrain.launch.places.srun import SrunStep
from ringtrain.launch.places.ssh import SshGroup
from ringtrain.launch.supervision import RankGroup


class _Table(Mapping[str, type[RankGroup]]):
    """Place name -> the class that starts a group there. A backend whose modules stand on the drivers
    (Ray's: its driver builds on the fixed-size one) is named as ``"module:Class"`` and imported when
    first looked up, so the drivers can import this table without importing it."""

    def __init__(self, entries: Mapping[str, type[RankGroup] | str]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> type[RankGroup]:
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


#: Place name -> the class that starts a group there (``PLACES[name](host, argv, env, ...)``; the Ray
#: place also takes its actor and node, see :class:`~ringtrain.launch.ray.group.RayGroup`).
PLACES: Mapping[str, type[RankGroup]] = _Table({
    LocalGroup.kind: LocalGroup,
    SshGroup.kind: SshGroup,
    SrunStep.kind: SrunStep,
    "ray": "ringtrain.launch.ray.group:RayGroup",
    "ray-bridged": "ringtrain.launch.ray.bridged_group:BridgedRayGroup",
})

__all__ = ["PLACES", "LocalGroup", "SrunStep", "SshGroup"]
