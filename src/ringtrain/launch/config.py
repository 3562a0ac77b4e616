"""The resolved launch request: a frozen ``LaunchConfig``, and what it means for the workers' environment.

The command line builds it (``ringtrain.cli.run.config_from_args``), so do ``ringtrain.run(func)`` and
``ringtrain train``. Where the job runs (Slurm, PBS, hosts) is decided later by
:mod:`ringtrain.launch.plan`. A driver hands a config to the agent of each host (and an ``srun`` task)
as JSON (:meth:`LaunchConfig.to_json`), so a field added here reaches every node with no other change.

Every variable a worker gets from ``ringtrain run`` is derived here, in :func:`worker_environment`.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ringtrain.exceptions import UsageError
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.worker_entry import NO_PYTHON_VARIABLE
from ringtrain.shim import shim_pythonpath
from ringtrain.watch.node import HANG_TIMEOUT_VARIABLE, WATCH_VARIABLE


@dataclass(frozen=True)
class DriverLink:
    """Set by a multi-host driver on the config of each agent it starts; never by a flag.

    Such an agent reports failures as marker lines for the driver to relay, and stops its ranks
    when its stdin closes (the driver went away).
    """

    node_slots: tuple[int, ...]
    """Ranks on every node, in node-rank order (Horovod's cross rank and size come from them)."""
    node_hosts: tuple[str, ...]
    """Every node's host name as the driver knows it, in node-rank order (``HOROVOD_HOSTNAME``)."""



@dataclass(frozen=True)
class LaunchConfig:
    """Everything ``launch`` needs, resolved from flags; nothing here is read again from argv."""

    command: tuple[str, ...]
    num_proc: int | None = None
    hosts: tuple[HostSlots, ...] | None = None
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    start_timeout: float = 30.0
    network_interfaces: tuple[str, ...] = ()
    output_filename: str | None = None
    verbose: bool = False
    check_build: bool = False
    log_level: str | None = None
    nnodes: tuple[int, int] | None = None
    nproc_per_node: int | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    standalone: bool = False
    max_restarts: int = 0
    hang_timeout: float | None = None
    """Seconds without progress that end a stuck job (None: the watch's default)."""
    watch: bool = True
    """Watch the ranks for a stuck job and name the rank it waits for (``--no-watch``: off)."""
    requeue: bool = False
    """``--requeue``: when the ranks end preempted (status 75), requeue the batch job this launcher runs
    in and end 0 (launch/requeue.py). Only the launcher does: never set on the agents it starts."""
    master_addr: str | None = None
    master_port: int | None = None
    horovod_shim: bool = True
    tuning: Mapping[str, str] = field(default_factory=dict)
    """``HOROVOD_*`` (and NCCL) variables set by horovodrun's tuning flags."""
    exports: Mapping[str, str | None] = field(default_factory=dict)
    """``-x NAME=value`` (value given) and ``-x NAME`` (None: the launcher's own value, which travels in
    the environment of the agents, never in this config, so that a secret stays out of ``ps``)."""
    no_python: bool = False
    """``--no-python``: exec the command as it is, even a ``.py`` file or ``python`` itself."""
    log_dir: str | None = None
    """``--log-dir``: keep every rank's output files here (torchrun's layout) instead of a temp folder."""
    redirects: str | None = None
    """``--redirects``: streams (torchrun's ``N`` or ``LOCAL_RANK:N,...``; 1 out, 2 err, 3 both) that
    go to the files only, not to the console."""
    tee: str | None = None
    """``--tee``: streams that go to the console and the files (wins over ``redirects``)."""
    local_addr: str | None = None
    """``--local-addr``: this node's address for the rendezvous (c10d: node 0's is the workers'
    MASTER_ADDR)."""
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    """``--rdzv-conf key=value,...``: extra settings of the rendezvous handler (``timeout``, ...)."""
    driver: DriverLink | None = None
    """Set on the agents a multi-host driver starts (see :class:`DriverLink`)."""
    notes: tuple[str, ...] = ()
    """Warnings about flags that were accepted but change nothing here; printed by ``launch``."""
    min_np: int | None = None
    """Elastic: fewest workers to go on with (horovodrun's --min-np; default -np)."""
    max_np: int | None = None
    """Elastic: most workers ever started at once (--max-np; default unbounded)."""
    slots_per_host: int | None = None
    """Elastic: slots of a discovered host printed without ``:slots`` (--slots-per-host)."""
    host_discovery_script: str | None = None
    """Elastic: command printing the available ``host[:slots]`` lines, run every second."""
    elastic_timeout: float | None = None
    """Elastic: seconds to wait for --min-np slots (None: HOROVOD_ELASTIC_TIMEOUT, else 600)."""
    reset_limit: int | None = None
    """Elastic: most re-formations of the group before the job fails (None: no limit)."""
    cooldown_range: tuple[int, int] | None = None
    """Elastic: blacklist cooldown bounds in seconds (None: a blacklisted host never comes back)."""
    ray: str | None = None
    """``--ray [ADDRESS]``: run one agent per Ray node as a Ray actor (None: not on Ray; ``auto``: the
    cluster ``RAY_ADDRESS`` names, else the one started on this machine). See launch/ray/driver.py."""
    ray_cpus_per_rank: float = 1.0
    """``--ray-cpus-per-rank``: CPUs the placement group reserves for each rank."""
    ray_gpus_per_rank: float = 0.0
    """``--ray-gpus-per-rank``: GPUs reserved for each rank (their node's agent sees them)."""
    ray_placement_timeout: float = 100.0
    """``--ray-placement-timeout``: seconds the cluster may take to fit the ranks before the job fails."""

    @property
    def elastic(self) -> bool:
        """Horovod elastic mode: --min-np, --max-np or --host-discovery-script was given."""
        return self.min_np is not None or self.max_np is not None or self.host_discovery_script is not None

    @property
    def worker_env(self) -> dict[str, str]:
        """The variables this config alone gives every worker: tuning flags, NICs, log level, timeout.

        :func:`worker_environment` adds what depends on the host and the node.
        """
        env = dict(self.tuning)
        if self.network_interfaces:
            env["GLOO_SOCKET_IFNAME"] = ",".join(self.network_interfaces)
            env["NCCL_SOCKET_IFNAME"] = ",".join(self.network_interfaces)
            env["HOROVOD_GLOO_IFACE"] = self.network_interfaces[0]
        if self.log_level:
            env["HOROVOD_LOG_LEVEL"] = self.log_level
        env.update({name: value for name, value in self.exports.items() if value is not None})
        if self.no_python:
            env[NO_PYTHON_VARIABLE] = "1"
        env["HOROVOD_START_TIMEOUT"] = f"{self.start_timeout:g}"
        if self.hang_timeout is not None:
            env[HANG_TIMEOUT_VARIABLE] = f"{self.hang_timeout:g}"
        if not self.watch:
            env[WATCH_VARIABLE] = "0"
        return env

    def table(self) -> str:
        """The resolved configuration as an aligned two-column table (``--verbose``)."""
        rows = []
        for f in fields(self):
            value: Any = getattr(self, f.name)
            if f.name == "hosts" and value:
                value = ",".join(f"{h.host}:{h.slots}" for h in value)
            elif f.name in ("tuning", "rdzv_conf"):
                value = " ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
            elif f.name == "exports":
                value = " ".join(k if v is None else f"{k}={v}" for k, v in sorted(value.items())) or "-"
            elif f.name == "command":
                value = " ".join(value)
            rows.append((f.name, "-" if value is None else str(value)))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"  {name.ljust(width)} : {value}" for name, value in rows)

    def to_json(self) -> str:
        """This config as one line of JSON (what a driver hands to each node's agent)."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LaunchConfig:
        """The inverse of :meth:`to_json`; a field this ringtrain does not know is an error."""
        return _decode(cls, json.loads(text))


def _decode(hint: Any, value: Any) -> Any:
    """``value`` (as ``json.loads`` gives it) as the type ``hint`` names: tuples, dataclasses, unions."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner, value)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], item) for item in value)
        return tuple(_decode(arg, item) for arg, item in zip(args, value))
    if origin is not None and issubclass(origin, Mapping):
        return dict(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        names = {f.name for f in fields(hint)}
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(f"{hint.__name__} JSON has unknown field(s) {unknown}. HINT: install the same "
                             "ringtrain version on every host of the job.")
        return hint(**{name: _decode(hints[name], item) for name, item in value.items()})
    if hint is float:
        return float(value)
    return value


def worker_environment(config: LaunchConfig, environ: Mapping[str, str], nproc: int, local_only: bool,
                       node_hosts: tuple[str, ...] | None = None) -> dict[str, str]:
    """Variables the workers of this node get on top of ``environ`` (the agent's own environment).

    The config's own (:attr:`LaunchConfig.worker_env`), then: unbuffered output, one thread per rank
    when several share the node, loopback for gloo on a single machine, the ``horovod`` shim on
    PYTHONPATH, and the node layout a driver knows (``RINGTRAIN_NODE_SLOTS`` / ``_HOSTS``).
    """
    env = config.worker_env
    env.update(exported_values(config, environ))
    env["PYTHONUNBUFFERED"] = "1"
    if "OMP_NUM_THREADS" not in environ and nproc > 1:
        env["OMP_NUM_THREADS"] = "1"  # as torchrun: n ranks x all cores oversubscribes the machine
    if local_only and "GLOO_SOCKET_IFNAME" not in environ and "GLOO_SOCKET_IFNAME" not in env:
        names = {name for _, name in socket_if_names()}
        if "lo" in names:
            env["GLOO_SOCKET_IFNAME"] = "lo"
    pythonpath = shim_pythonpath(environ, config.horovod_shim)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if config.driver is not None:
        env["RINGTRAIN_NODE_SLOTS"] = ",".join(str(s) for s in config.driver.node_slots)
        node_hosts = config.driver.node_hosts
    if node_hosts:
        env["RINGTRAIN_NODE_HOSTS"] = ",".join(node_hosts)
    return env


def socket_if_names() -> list[tuple[int, str]]:
    """Network interfaces of this host (empty where the platform cannot list them)."""
    try:
        return socket.if_nameindex()
    except OSError:
        return []



def exported_values(config: LaunchConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The values of ``-x``: given ones as they are, bare names from ``environ`` (the launcher's, or an
    agent's that the launcher forwarded them to). A bare name that is not set is a usage error."""
    values = {}
    for name, value in config.exports.items():
        if value is None:
            if name not in environ:
                raise UsageError(f"-x {name}: {name} is not set in the launcher's environment, so there "
                                 f"is no value to pass on. HINT: export {name}=... before ringtrain run, or "
                                 f"give the value: -x {name}=VALUE.")
            value = environ[name]
        values[name] = value
    return values
