"""Reaching the Ray cluster and reserving room on it (the placement group), with errors that say why.

``ray.init`` toward an address nobody answers on retries for a long time; the reachability check
below turns that into one error within ``timeout_s``. A placement group that the cluster cannot fit
waits forever; :func:`reserve` gives up after ``placement_group_timeout_s`` and names what was asked
and what the cluster has.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ringtrain.engine.netutil import route_address

#: The variable Ray itself reads for the cluster to join.
ADDRESS_VARIABLE = "RAY_ADDRESS"


class ClusterUnreachableError(ConnectionError):
    """No Ray cluster answers at the address given."""


class PlacementTimeoutError(TimeoutError):
    """The cluster could not fit the workers within ``placement_group_timeout_s``."""


def connect(address: str | None, timeout_s: float,
            timeout_hint: str = "raise create_settings(timeout_s=...)", quiet: bool = False) -> None:
    """``ray.init`` unless this process is connected already.

    ``address`` (else ``RAY_ADDRESS``): ``host:port`` of a cluster's head (its GCS port), ``ray://...``
    (Ray Client) or ``auto``; None or empty starts a local cluster, as ``ray.init()`` does.
    ``timeout_hint``: how the caller's user gives more time (the error's hint ends with it).
    ``quiet``: Ray's own info lines stay off this process's stderr, and so does the actors' output
    (``ringtrain run --ray`` relays its agents' output itself).
    """
    import ray  # the ray extra: every function imports it where used, so the package loads without it

    if ray.is_initialized():
        return
    address = (address or os.environ.get(ADDRESS_VARIABLE, "")).strip() or None
    if address not in (None, "auto", "local"):
        _check_reachable(address, timeout_s, timeout_hint)
    client = address is not None and address.startswith("ray://")
    output: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING} if quiet else \
        {"log_to_driver": True}
    if quiet and client:
        _quiet_client_log_stream()
    for attempt in range(1, CLIENT_SESSION_ATTEMPTS + 1):
        try:
            with warnings.catch_warnings():
                if quiet and client:  # Ray Client's own warning on a timeout: the error below says more
                    warnings.simplefilter("ignore", UserWarning)
                ray.init(address=address, include_dashboard=False, **output)
            return
        except ConnectionError as exc:
            if not client or address is None:  # (a client always has an address)
                raise
            if _session_server_died(exc) and attempt < CLIENT_SESSION_ATTEMPTS:
                # Ray's client server starts one process per session; when that process dies at start
                # (seen in about one connection of two on a loaded two-core machine, with nothing in its
                # log), the next connection gets a fresh one. Ray's client has disconnected itself.
                logging.getLogger(__name__).info("the Ray Client server's session process died at start "
                                                 "(attempt %d of %d); connecting again", attempt,
                                                 CLIENT_SESSION_ATTEMPTS)
                continue
            raise ClusterUnreachableError(_client_refused(address, exc)) from exc


#: Connections to a Ray Client server whose session process dies at start, before the error is the user's.
CLIENT_SESSION_ATTEMPTS = 3
#: Ray's client server's words for a session process that exited before serving (ray/util/client/server).
_SESSION_SERVER_DIED = "Starting Ray client server failed"


def _session_server_died(exc: BaseException) -> bool:
    return _SESSION_SERVER_DIED in str(exc)


#: The logger Ray Client re-logs the server's log records with, on this process's stderr.
CLIENT_LOG_STREAM = "ray.util.client.logsclient"


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _quiet_client_log_stream() -> None:
    """Keep the Ray Client server's own warnings (its session's ``ray.init`` runs in a thread and says
    so) off the user's terminal, as the local driver's are; errors still show. A filter, not a level:
    Ray sets that logger's level itself when the session starts."""
    stream = logging.getLogger(CLIENT_LOG_STREAM)
    if not any(isinstance(f, _ErrorsOnly) for f in stream.filters):
        stream.addFilter(_ErrorsOnly())


#: Ray's switch for its token authentication, which the cluster's nodes and every client must agree on.
AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"


def _client_refused(address: str, exc: BaseException) -> str:
    """The error for a Ray Client server that accepts the connection but opens no session."""
    head = (f"the Ray Client server at {address} accepted the connection but started no session "
            f"({str(exc).strip().rstrip('.')})")
    if os.environ.get(AUTH_MODE_VARIABLE, "").strip().lower() != "token":
        # Ray 2.59 turned token authentication on by default for `ray start --head`, and its Ray Client
        # sends the token only when this variable says so: the server then refuses every call, and the
        # client reports a timeout.
        return (f"{head}. HINT: a cluster with Ray's token authentication (the default of `ray start --head` "
                f"since Ray 2.59) needs {AUTH_MODE_VARIABLE}=token where you run this, with the cluster's "
                "token in RAY_AUTH_TOKEN or ~/.ray/auth_token (`ray get-auth-token` on the head prints it).")
    return (f"{head}. HINT: check that RAY_AUTH_TOKEN (or ~/.ray/auth_token) holds the cluster's token, and "
            "read ray_client_server.err in the head's Ray log folder.")


def _check_reachable(address: str, timeout_s: float, timeout_hint: str) -> None:
    target = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT). HINT: give the "
                         "head node's address as `ray start --head` printed it, e.g. 10.0.0.1:6379.")
    deadline = time.monotonic() + timeout_s
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.strip("[]"), int(port)),
                                          timeout=max(0.1, min(5.0, deadline - time.monotonic()))):
                return
        except OSError as exc:
            last = exc
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise ClusterUnreachableError(
        f"no Ray cluster answers at {address} within {timeout_s:g} s ({last}). HINT: start one there with "
        f"`ray start --head`, check the address and that its port is reachable from this host, or "
        f"{timeout_hint}.")


@dataclass(frozen=True)
class Reservation:
    """The placement group the workers go into, and whether the executor made it (and removes it)."""

    group: Any  # ray.util.placement_group.PlacementGroup
    owned: bool
    #: Bundle index per worker (-1: any bundle of a group the executor did not make).
    bundles: tuple[int, ...]


def reserve(bundle: Mapping[str, float], num_bundles: int, strategy: str, workers_per_bundle: int,
            timeout_s: float, use_current: bool,
            timeout_hint: str = "raise placement_group_timeout_s") -> Reservation:
    """Make (or, with ``use_current`` inside one, take the current) placement group for the workers.
    ``timeout_hint``: how the caller's user gives more time (the error's hint names it)."""
    import ray
    from ray.util.placement_group import get_current_placement_group, remove_placement_group

    if use_current:
        current = get_current_placement_group()
        if current is not None:
            return Reservation(group=current, owned=False, bundles=(-1,) * (num_bundles * workers_per_bundle))
    bundles = [{k: v for k, v in bundle.items() if v} for _ in range(num_bundles)]
    group = ray.util.placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise PlacementTimeoutError(
            f"the Ray cluster could not place {num_bundles} bundle(s) of {_resources(bundles[0])} "
            f"({strategy}) within {timeout_s:g} s: the cluster has "
            f"{_resources(ray.cluster_resources())} in all, {_resources(ray.available_resources())} free, on "
            f"{_alive_nodes()} node(s). HINT: ask for fewer workers or CPUs/GPUs per worker, add nodes, or "
            f"{timeout_hint} for an autoscaling cluster.")
    order = tuple(index for index in range(num_bundles) for _ in range(workers_per_bundle))
    return Reservation(group=group, owned=True, bundles=order)


def release(reservation: Reservation | None) -> None:
    """Remove the placement group if the executor made it."""
    from ray.util.placement_group import remove_placement_group

    if reservation is not None and reservation.owned:
        try:
            remove_placement_group(reservation.group)
        except Exception:  # the cluster may be gone already; nothing left to free then
            pass


def store_host(node_ips: Iterable[str]) -> str:
    """Where a job store hosted in this process listens for ranks on the Ray nodes ``node_ips``: loopback
    when all of them are this node, else the address this host uses toward them (this node's Ray address
    when the routes differ)."""
    node_ips = list(node_ips)
    here = driver_address(node_ips)
    remote = sorted({ip for ip in node_ips if ip != here})
    if not remote:
        return "127.0.0.1"
    routes = {route_address(ip) for ip in remote}
    if len(routes) == 1 and None not in routes:
        return str(routes.pop())
    return here


def driver_address(node_ips: Sequence[str]) -> str:
    """This driver's address as the Ray nodes ``node_ips`` reach it: its own Ray node's; a Ray Client
    driver is on no Ray node, so the address this host routes toward the first of them by (Ray's own
    guess there probes a public address, which an air-gapped cluster has no route to)."""
    import ray
    from ray.util.client import ray as client

    if client.is_connected():
        for ip in node_ips:
            route = route_address(ip)
            if route is not None:
                return route
    return str(ray.util.get_node_ip_address())


def node_addresses() -> dict[str, str]:
    """The IP address of every live Ray node, by node id (hex)."""
    import ray

    return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}


def _resources(resources: Mapping[str, Any]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU") or k.startswith("accelerator_type")}
    return "{" + ", ".join(f"{k}: {v:g}" if isinstance(v, int | float) else f"{k}: {v}"
                           for k, v in sorted(shown.items())) + "}"


def _alive_nodes() -> int:
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))
