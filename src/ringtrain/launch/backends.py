"""The elastic driver's backends, chosen once from the configuration (launch/backend.py has the interface)."""

from __future__ import annotations

from ringtrain.launch.backend import Backend
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.elastic_hosts import FixedHosts, ScriptDiscovery
from ringtrain.launch.hosts_backend import HostsBackend


def select_backend(config: LaunchConfig, num_proc: int) -> Backend:
    """The backend of an elastic job, chosen once from ``config``: the Ray cluster's nodes (``--ray``),
    the hosts a discovery script prints, the ``-H``/``--hostfile`` hosts, or this machine with
    ``num_proc`` slots."""
    if config.ray is not None:
        from ringtrain.launch.ray.elastic import RayHosts  # the ray extra: loaded for --ray only

        return RayHosts(config.ray_cpus_per_rank, config.ray_gpus_per_rank,
                        start_timeout=max(config.start_timeout, 60.0))
    if config.host_discovery_script:
        return HostsBackend(ScriptDiscovery(config.host_discovery_script, config.slots_per_host,
                                            timeout=max(config.start_timeout, 10.0)), config)
    if config.hosts:
        return HostsBackend(FixedHosts({h.host: h.slots for h in config.hosts}, "-H/--hostfile"), config)
    return HostsBackend(FixedHosts({"localhost": num_proc}, "this machine"), config)


__all__ = ["select_backend"]
