"""The places a driver can start a group of ranks on, by name: one module each, one entry each here.

A new backend (Ray actors, Kubernetes pods, ...) is a module beside these that implements
:class:`ringtrain.launch.supervision.RankGroup` (or subclasses
:class:`~ringtrain.launch.supervision.ProcessGroup` when a child process of the driver stands for the
group, :class:`~ringtrain.launch.supervision.RelayedGroup` when only its output comes here, as Ray's)
and one line in :data:`PLACES`; docs/architecture.md walks through it.
"""

from __future__ import annotations

from ringtrain.launch.places.local import LocalGroup
from ringtrain.launch.places.ray import RayGroup
from ringtrain.launch.places.ray_bridged import BridgedRayGroup
from ringtrain.launch.places.srun import SrunStep
from ringtrain.launch.places.ssh import SshGroup
from ringtrain.launch.supervision import RankGroup

#: Place name -> the class that starts a group there (``PLACES[name](host, argv, env, ...)``; the Ray
#: place also takes its actor and node, see :class:`~ringtrain.launch.places.ray.RayGroup`).
PLACES: dict[str, type[RankGroup]] = {
    LocalGroup.kind: LocalGroup,
    SshGroup.kind: SshGroup,
    SrunStep.kind: SrunStep,
    RayGroup.kind: RayGroup,
    BridgedRayGroup.kind: BridgedRayGroup,
}

__all__ = ["PLACES", "BridgedRayGroup", "LocalGroup", "RayGroup", "SrunStep", "SshGroup"]
