"""This rank's machine and engine as ``ringtrain check`` reports them: the API, backends, GPUs, device,
what carries the control messages, and the identity part of the report."""

from __future__ import annotations

import socket
from types import ModuleType

import torch
import torch.distributed as dist

import ringtrain
from ringtrain.check.report import CheckReport


def load_api() -> ModuleType:
    """ringtrain's Horovod-compatible API: the package itself, as in ``import ringtrain as hvd``."""
    return ringtrain


def backend_availability() -> dict[str, bool]:
    """Which torch.distributed backends this torch build has."""
    return {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
            "mpi": dist.is_mpi_available(), "ucc": dist.is_ucc_available()}


def gpu_names() -> list[str]:
    """Names of the CUDA devices this process can see (empty on CPU-only machines)."""
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def pick_device(requested: str, local_rank: int) -> torch.device:
    """``auto`` means this rank's GPU when there is one, else the CPU."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda was asked for but torch sees no CUDA device. "
                             "HINT: use --device cpu, or install a CUDA build of torch.")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(requested)


def control_plane_description() -> str:
    """What carries the engine's negotiation rounds (firewalls care: the mesh uses its own ports)."""
    from ringtrain.engine import state
    from ringtrain.engine.control_plane import DEFAULT_MAX_RANKS

    engine = state.engine
    if engine is None or engine.size == 1:
        return "none (one process)"
    if engine.plane is None:
        return f"gloo (RINGTRAIN_CONTROL_PLANE=gloo, or more than {DEFAULT_MAX_RANKS} ranks)"
    arena = engine.groups.arena
    if arena is not None and arena.disabled is None:
        # The arena's segments are set up at the first large allreduce: until then it may still refuse.
        large = "shared memory (all ranks on one host), else ring over the mesh"
    elif arena is not None:
        large = f"ring over the mesh (shared memory is off: {arena.disabled})"
    elif engine.cpu_ring:
        large = "ring over the mesh"
    else:
        large = "gloo (RINGTRAIN_CPU_ALLREDUCE=gloo)"
    return (f"tcp socket mesh ({engine.size - 1} connection(s) per rank, messages up to "
            f"{engine.plane.max_message // 1024} KiB); large CPU allreduces: {large}")


def new_report(hvd: ModuleType, device: torch.device, environment: str) -> CheckReport:
    """The identity part of a report: who and where this rank is."""
    return CheckReport(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(),
                       hostname=socket.gethostname(), device=str(device), environment=environment,
                       backends=backend_availability(), control_plane=control_plane_description(),
                       gpus=gpu_names())
