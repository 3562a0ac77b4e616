"""The world rendezvous: who am I, the key-value store all ranks share, and the gloo/NCCL groups built on it.

The engine builds its own process groups straight from a store instead of going through
``torch.distributed``'s global default group, so that ``shutdown()`` + ``init()`` can repeat in one
process and a user's own ``init_process_group`` is left alone.

The store is the job store (:mod:`ringtrain.engine.job_store`): only processes that hold the job's
secret (``RINGTRAIN_JOB_SECRET``) can read or write it. Where it lives:

- ``ringtrain run`` hosts it (node 0's agent, where the nodes' agents meet too) and tells the workers
  (``RINGTRAIN_JOB_STORE``, with the secret);
- otherwise rank 0 hosts it: on ``MASTER_ADDR:MASTER_PORT`` (mpirun, srun, plain env://), or, where
  that port is taken by a store of torch's (torchrun's agent store, a ``init_process_group`` the user
  called first), on a port of its own whose address it publishes through that store. A published
  address need not be trusted: a client accepts only a server that proves the secret.

Keys are namespaced by run id, restart attempt (``RINGTRAIN_ATTEMPT`` under ``ringtrain run``,
else ``TORCHELASTIC_RESTART_COUNT``) and ``init()`` generation, so a restarted attempt, or the next
``init()`` in the same processes, never reads a key of an earlier one. The base store lives as long
as the process: the server in rank 0 must outlive a generation, since other ranks may still be
reading from it.

Every gloo group is checked once when it is built (:func:`verify_gloo_group`): gloo's own listening
socket pairs up any connection that names the right sequence number, so each rank proves the job's
secret to every other rank over the group's own connections before the group carries data.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringtrain.engine import auth, job_store
from ringtrain.engine.netutil import candidate_addresses, interface_address
from ringtrain.env import detect_environment
from ringtrain.exceptions import AuthenticationError

#: Base stores kept alive across generations (C++ users hold them without keeping them alive).
_BASE_STORES: dict[tuple[object, ...], dist.Store] = {}
#: Job store servers this process hosts (rank 0 of a job started without ringtrain's launcher).
_SERVERS: dict[tuple[object, ...], job_store.JobStoreServer] = {}
_generation = 0
_GLOO_CHECK_BYTES = 16


@dataclass(frozen=True)
class World:
    """This process's place in the job and the store of the current generation."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    store: dist.Store
    reused_torch_world: bool
    #: Where the job's store lives: the control plane advertises the address that routes there.
    main_address: str = ""
    #: Index of this node as the launcher numbered it (hierarchical collectives group ranks by node).
    node_rank: int = 0
    #: The job's secret (None: an unauthenticated job); proves membership on every connection.
    secret: str | None = field(default=None, repr=False)
    #: The namespace of this generation's keys: also binds every proof to this generation.
    scope: str = ""

    @property
    def single_host(self) -> bool:
        """Every rank runs on this host (so every connection can stay on loopback)."""
        return self.local_size >= self.size


#: Facts about the launch, not knobs (those come from Settings): where the launcher's job store is,
#: the job's secret, and whether / which run and attempt torch's elastic agent started.
LAUNCH_FACTS = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                "RINGTRAIN_ATTEMPT", auth.ENV_ADDRESS, auth.ENV_SECRET)


def launch_facts() -> dict[str, str]:
    """This process's :data:`LAUNCH_FACTS` (the only variables the engine reads outside Settings)."""
    return {name: os.environ[name] for name in LAUNCH_FACTS if name in os.environ}


def rendezvous(timeout_s: float, interfaces: Sequence[str] = (),
               handshake_timeout_s: float = job_store.HANDSHAKE_TIMEOUT) -> World:
    """Find rank and size, connect to (or host) the job store, and start a new generation.

    ``timeout_s`` bounds the wait for the store (``HOROVOD_GLOO_TIMEOUT_SECONDS``); ``interfaces``
    (``GLOO_SOCKET_IFNAME``'s) name the job's network where rank 0 must pick an address to listen on;
    ``handshake_timeout_s`` is how long a connection to a job store rank 0 hosts may take to prove
    itself (``RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS``).
    """
    global _generation
    _generation += 1
    timeout = datetime.timedelta(seconds=timeout_s)
    placement = detect_environment().placement()
    facts = launch_facts()
    secret = auth.secret_from_environ(facts)
    if dist.is_available() and dist.is_initialized():
        # The user set up torch.distributed already: take rank and size from it, leave its groups alone.
        rank, size, reused = dist.get_rank(), dist.get_world_size(), True
    else:
        rank, size, reused = placement.rank, placement.world_size, False
    if placement.world_size == size and placement.rank == rank:
        local_rank, local_size = placement.local_rank, placement.local_world_size
        cross_rank, cross_size = placement.cross_rank, placement.cross_size
        node_rank = placement.node_rank
    else:
        local_rank, local_size, cross_rank, cross_size, node_rank = 0, 1, rank, size, rank
    where = _Where(placement.main_address, placement.main_port, local_size >= size, tuple(interfaces),
                   handshake_timeout_s)
    base = _base_store(where, rank, size, timeout, secret, reused, facts)
    scope = namespace(_generation, facts)
    return World(
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        cross_rank=cross_rank,
        cross_size=cross_size,
        hostname=placement.hostname,
        store=dist.PrefixStore(scope, base),
        reused_torch_world=reused,
        main_address=placement.main_address,
        node_rank=node_rank,
        secret=secret,
        scope=scope,
    )


def attempt_namespace(facts: Mapping[str, str]) -> str:
    """``ringtrain/<run id>/attempt<n>``: the keys of one attempt of one run.

    The attempt is ``RINGTRAIN_ATTEMPT`` (set by ``ringtrain run``: the rendezvous round, the same on
    every node), else torchrun's ``TORCHELASTIC_RESTART_COUNT``, else 0; the run id is torch's agent's
    ``TORCHELASTIC_RUN_ID`` (``job`` without one).
    """
    run_id = facts.get("TORCHELASTIC_RUN_ID", "").strip() or "job"
    attempt = (facts.get("RINGTRAIN_ATTEMPT", "").strip()
               or facts.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0")
    return f"ringtrain/{run_id}/attempt{attempt}"


def namespace(generation: int, facts: Mapping[str, str] | None = None) -> str:
    """The key prefix of one ``init()``: run id, attempt and generation, so that no attempt of a restarted
    job (``--max-restarts``) and no earlier ``init()`` of this process is ever read again. ``facts``:
    the launch's (default: this process's :func:`launch_facts`)."""
    return f"{attempt_namespace(launch_facts() if facts is None else facts)}/gen{generation}"


@dataclass(frozen=True)
class _Where:
    """What decides where rank 0's job store listens."""

    address: str  # MASTER_ADDR
    port: int  # MASTER_PORT
    single_host: bool
    interfaces: tuple[str, ...]
    handshake_timeout_s: float


def _base_store(where: _Where, rank: int, size: int, timeout: datetime.timedelta, secret: str | None,
                reused: bool, facts: Mapping[str, str]) -> dist.Store:
    if size == 1:
        # A single process needs no network at all: `python train.py` works without MASTER_ADDR.
        key: tuple[object, ...] = ("", 0, 1, True)
        if key not in _BASE_STORES:
            _BASE_STORES[key] = dist.HashStore()
        return _BASE_STORES[key]
    launcher_store = job_store.address_from_environ(facts)
    if launcher_store is not None:
        # ringtrain run hosts the job store; the workers only connect.
        key = ("launcher", launcher_store)
        if key not in _BASE_STORES:
            _BASE_STORES[key] = _connect(launcher_store, secret, timeout, rank, size)
        return _BASE_STORES[key]
    if secret is None and rank == 0:
        auth.warn_unauthenticated(f"this job of {size} ranks")
    # Under torchrun the elastic agent already hosts a store at MASTER_ADDR:MASTER_PORT.
    if reused or facts.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return _published_store(where, rank, size, timeout, secret, reused, facts)
    key = ("rank0", where.address, where.port, size)
    if key not in _BASE_STORES:
        if rank == 0:
            _SERVERS[key] = _host_server(secret, _bind_address(where, fixed=True), where.port, where)
        _BASE_STORES[key] = _connect(job_store.join_address(where.address, where.port), secret, timeout, rank,
                                     size)
    return _BASE_STORES[key]


def _published_store(where: _Where, rank: int, size: int, timeout: datetime.timedelta,
                     secret: str | None, reused: bool, facts: Mapping[str, str]) -> dist.Store:
    """Rank 0 hosts the job store on a port of its own and publishes it through torch's store."""
    bootstrap: dist.Store | None
    if reused:
        bootstrap = dist.distributed_c10d._get_default_store()
    else:  # under torchrun the elastic agent hosts a store at MASTER_ADDR:MASTER_PORT
        bootstrap = _BASE_STORES.get(("agent", where.address, where.port))
        if bootstrap is None:
            try:
                bootstrap = dist.TCPStore(where.address, where.port, size, False, timeout=timeout)
            except Exception as exc:  # re-raised with the values that matter
                raise ValueError(
                    f"Horovod initialization failed: cannot reach the rendezvous store at "
                    f"{where.address}:{where.port} (rank {rank} of {size}): {exc}. HINT: check "
                    "MASTER_ADDR/MASTER_PORT, that rank 0 is running, and that the port is free and "
                    "reachable.") from exc
            _BASE_STORES[("agent", where.address, where.port)] = bootstrap
    published = f"{attempt_namespace(facts)}/job_store"
    key = ("published", id(bootstrap), published)
    if key not in _BASE_STORES:
        if rank == 0:
            host = _bind_address(where, fixed=False)
            server = _host_server(secret, host, 0, where)
            _SERVERS[key] = server
            advertised = host if host not in ("0.0.0.0", "::") else _advertised_address(where)
            bootstrap.set(published, job_store.join_address(advertised, server.port))
        bootstrap.wait([published], timeout)
        _BASE_STORES[key] = _connect(bootstrap.get(published).decode(), secret, timeout, rank, size)
    return _BASE_STORES[key]


def _host_server(secret: str | None, host: str, port: int, where: _Where) -> job_store.JobStoreServer:
    try:
        return job_store.JobStoreServer(secret, host=host, port=port,
                                       handshake_timeout=where.handshake_timeout_s)
    except OSError as exc:
        raise ValueError(
            f"Horovod initialization failed: rank 0 cannot host the job store: {exc}. HINT: check "
            f"MASTER_ADDR={where.address} (an address of rank 0's host) and MASTER_PORT={port} (a free "
            "port).") from None


def _connect(where: str, secret: str | None, timeout: datetime.timedelta, rank: int, size: int) -> dist.Store:
    try:
        return job_store.JobStore(where, secret, timeout)
    except AuthenticationError:
        raise
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"Horovod initialization failed: cannot reach the rendezvous store at {where} (rank {rank} of "
            f"{size}): {exc}. HINT: check MASTER_ADDR/MASTER_PORT, that rank 0 is running, and that the "
            "port is free and reachable.") from exc


def _bind_address(where: _Where, fixed: bool) -> str:
    """Where rank 0's job store listens: loopback for one host, else the job's address, else everywhere.

    ``fixed``: the others connect to ``MASTER_ADDR`` itself, so the server must listen there.
    """
    if where.single_host and (not fixed or _is_loopback(where.address)):
        return "127.0.0.1"
    try:
        resolved = socket.gethostbyname(where.address) if where.address else ""
    except OSError:
        resolved = ""
    if resolved and _is_local(resolved):
        return resolved
    if not fixed:
        for name in where.interfaces:
            found = interface_address(name)
            if found:
                return found
    return "0.0.0.0"  # MASTER_ADDR is not an address of ours (a NAT, an alias): listen everywhere


def _advertised_address(where: _Where) -> str:
    found = candidate_addresses(where.address, where.interfaces)
    return found[0] if found else socket.gethostname()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return host == "localhost"


def _is_local(address: str) -> bool:
    """Whether this host can listen on ``address``."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def _gloo_devices(size: int, interfaces: Sequence[str]) -> list[dist.ProcessGroupGloo.Device]:
    if size == 1:
        return [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    if interfaces:
        return [dist.ProcessGroupGloo.create_device(interface=name) for name in interfaces]
    return [dist.ProcessGroupGloo.create_default_device()]


def make_gloo_group(
    world: World, tag: str, ranks: list[int], timeout_s: float, interfaces: Sequence[str] = (),
    setup_timeout_s: float | None = None,
) -> dist.ProcessGroupGloo | None:
    """A gloo group over ``ranks`` (global ranks); None on processes outside it.

    Only members take part in building it, so groups can be made for any subset without a
    collective over the whole world. ``interfaces`` are ``GLOO_SOCKET_IFNAME``'s (default: the
    interface of the host name). In a job with a secret the group is checked before it is returned
    (:func:`verify_gloo_group`, within ``setup_timeout_s``, default ``timeout_s``).
    """
    if world.rank not in ranks:
        return None
    # torch's stubs name it Options, which at run time is Backend.Options, without the gloo devices
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = datetime.timedelta(seconds=timeout_s)
    options._devices = _gloo_devices(len(ranks), interfaces)
    store = dist.PrefixStore(f"{tag}/", world.store)
    group = dist.ProcessGroupGloo(store, ranks.index(world.rank), len(ranks), options)
    if world.secret is not None and len(ranks) > 1:
        verify_gloo_group(group, world, tag, ranks, timeout_s if setup_timeout_s is None else setup_timeout_s)
    return group


def verify_gloo_group(group: dist.ProcessGroupGloo, world: World, tag: str, ranks: list[int],
                      timeout_s: float) -> None:
    """Every member proves the job's secret to every other member over the group's own connections.

    Gloo pairs a connection to its listening socket with whoever names the right sequence number
    first, without any credential; an outsider that won that race during setup would receive one
    rank's data and could feed it data of its own. One alltoall (which uses every connection of the
    group) carries, for each pair, a mark only the job's ranks can compute; a connection held by
    anyone else fails the check, and the group is never used. Costs one small alltoall per group,
    at setup only.
    """
    me, count = ranks.index(world.rank), len(ranks)
    key = auth.derive_key(world.secret, "gloo check v1")

    def mark(sender: int, receiver: int) -> bytes:
        message = f"{world.scope}/{tag}/{ranks[sender]}->{ranks[receiver]}".encode()
        return hmac.new(key, message, hashlib.sha256).digest()[:_GLOO_CHECK_BYTES]

    outgoing = b"".join(mark(me, other) for other in range(count))
    send = torch.frombuffer(bytearray(outgoing), dtype=torch.uint8)
    received = torch.empty(count * _GLOO_CHECK_BYTES, dtype=torch.uint8)
    splits = [_GLOO_CHECK_BYTES] * count
    try:
        # torch's stubs give Backend (ProcessGroupGloo's base) none of the collectives it has
        group.alltoall_base(  # type: ignore[attr-defined]
            received, send, splits, splits, dist.AllToAllOptions()).wait(
            datetime.timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise AuthenticationError(
            f"rank {world.rank}: the gloo group {tag!r} could not be checked within {timeout_s:g} s: {exc}. "
            "HINT: a rank of the group failed or is slow, or a process outside the job connected to this "
            "rank's gloo port while the group was set up; see docs/security.md.") from None
    data = received.numpy().tobytes()
    for other in range(count):
        if other == me:
            continue
        got = data[other * _GLOO_CHECK_BYTES:(other + 1) * _GLOO_CHECK_BYTES]
        if not auth.same(got, mark(other, me)):
            raise AuthenticationError(
                f"rank {world.rank}: the gloo connection that should lead to rank {ranks[other]} (group "
                f"{tag!r}) did not prove the job's secret: a process outside the job took it over while the "
                "group was set up. The group is not used. HINT: keep outsiders off the job's network (see "
                "docs/security.md) and start the job again.")


def make_nccl_group(world: World, tag: str, ranks: list[int],
                    timeout_s: float) -> dist.ProcessGroupNCCL | None:
    """An NCCL group over ``ranks`` for CUDA tensors; None on processes outside it."""
    if world.rank not in ranks:
        return None
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore(f"{tag}/nccl/", world.store)
    return dist.ProcessGroupNCCL(store, ranks.index(world.rank), len(ranks), options)


def hostname() -> str:
    return socket.gethostname()
