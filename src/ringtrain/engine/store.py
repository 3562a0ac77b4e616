"""Rendezvous: who am I, the key-value store all ranks share, and the gloo/NCCL groups built on it.

The engine builds its own process groups straight from a store instead of going through
``torch.distributed``'s global default group, so that ``shutdown()`` + ``init()`` can repeat in one
process and a user's own ``init_process_group`` is left alone. Each ``init()`` uses a new
generation prefix on the same long-lived base store (the TCP server lives in rank 0's process and must
outlive a generation, since other ranks may still be reading from it).
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from ringtrain.env import detect_environment

#: Base stores kept alive across generations, keyed by (address, port, world_size, is_server).
_BASE_STORES: dict[tuple[str, int, int, bool], dist.Store] = {}
_generation = 0


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


def rendezvous(timeout_s: float) -> World:
    """Find rank and size, connect to (or host) the store, and start a new generation.

    ``timeout_s`` bounds the wait for the store (``HOROVOD_GLOO_TIMEOUT_SECONDS``).
    """
    global _generation
    _generation += 1
    from ringtrain.engine import elastic_rendezvous

    if elastic_rendezvous.enabled():
        # Started by ringtrain's elastic driver: rank, size and the key namespace come from the
        # driver's current generation, not from RANK / WORLD_SIZE variables.
        return elastic_rendezvous.join(timeout_s)
    timeout = datetime.timedelta(seconds=timeout_s)
    placement = detect_environment().placement()
    if dist.is_available() and dist.is_initialized():
        # The user set up torch.distributed already: share its store, leave its groups alone.
        rank, size = dist.get_rank(), dist.get_world_size()
        base = dist.distributed_c10d._get_default_store()
        reused = True
    else:
        rank, size, reused = placement.rank, placement.world_size, False
        base = _base_store(placement.main_address, placement.main_port, rank, size, timeout)
    if placement.world_size == size and placement.rank == rank:
        local_rank, local_size = placement.local_rank, placement.local_world_size
        cross_rank, cross_size = placement.cross_rank, placement.cross_size
    else:
        local_rank, local_size, cross_rank, cross_size = 0, 1, rank, size
    store = dist.PrefixStore(f"ringtrain/gen{_generation}/", base)
    return World(
        rank=rank,
        size=size,
        local_rank=local_rank,
        local_size=local_size,
        cross_rank=cross_rank,
        cross_size=cross_size,
        hostname=placement.hostname,
        store=store,
        reused_torch_world=reused,
        main_address=placement.main_address,
    )


def _base_store(address: str, port: int, rank: int, size: int, timeout: datetime.timedelta) -> dist.Store:
    if size == 1:
        # A single process needs no network at all: `python train.py` works without MASTER_ADDR.
        key = ("", 0, 1, True)
        if key not in _BASE_STORES:
            _BASE_STORES[key] = dist.HashStore()
        return _BASE_STORES[key]
    # Under torchrun the elastic agent already hosts the store at MASTER_ADDR:MASTER_PORT.
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    is_server = rank == 0 and not agent_hosts
    key = (address, port, size, is_server)
    store = _BASE_STORES.get(key)
    if store is None:
        try:
            store = dist.TCPStore(address, port, size, is_server, timeout=timeout, wait_for_workers=False)
        except Exception as exc:  # noqa: BLE001 - re-raised with the values that matter
            raise ValueError(
                f"Horovod initialization failed: cannot reach the rendezvous store at {address}:{port} "
                f"(rank {rank} of {size}): {exc}. HINT: check MASTER_ADDR/MASTER_PORT, that rank 0 is "
                "running, and that the port is free and reachable."
            ) from exc
        _BASE_STORES[key] = store
    return store


def _gloo_devices(size: int, interfaces: Sequence[str]) -> list[dist.ProcessGroupGloo.Device]:
    if size == 1:
        return [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    if interfaces:
        return [dist.ProcessGroupGloo.create_device(interface=name) for name in interfaces]
    return [dist.ProcessGroupGloo.create_default_device()]


def make_gloo_group(
    world: World, tag: str, ranks: list[int], timeout_s: float, interfaces: Sequence[str] = ()
) -> dist.ProcessGroupGloo | None:
    """A gloo group over ``ranks`` (global ranks); None on processes outside it.

    Only members take part in building it, so groups can be made for any subset without a
    collective over the whole world. ``interfaces`` are ``GLOO_SOCKET_IFNAME``'s (default: the
    interface of the host name).
    """
    if world.rank not in ranks:
        return None
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    options._devices = _gloo_devices(len(ranks), interfaces)
    store = dist.PrefixStore(f"{tag}/", world.store)
    return dist.ProcessGroupGloo(store, ranks.index(world.rank), len(ranks), options)


def make_nccl_group(world: World, tag: str, ranks: list[int], timeout_s: float) -> dist.ProcessGroup | None:
    """An NCCL group over ``ranks`` for CUDA tensors; None on processes outside it."""
    if world.rank not in ranks:
        return None
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore(f"{tag}/nccl/", world.store)
    return dist.ProcessGroupNCCL(store, ranks.index(world.rank), len(ranks), options)


def hostname() -> str:
    return socket.gethostname()
