"""Where the GPU tests run: the device kind and the number of ranks, and the helpers ranks share.

Every test of ``tests/gpu`` runs the same code on the CPU (so CI runs it on every change) and on CUDA
(marked ``cuda``: ``python -m pytest -m cuda`` on a machine with a GPU). The placements:

- ``cpu-1``, ``cpu-2``: one rank, two ranks on gloo;
- ``cuda-1``: one rank on its GPU (NCCL with one member);
- ``cuda-2-shared``: two ranks on one GPU (``CUDA_VISIBLE_DEVICES`` keeps one visible), which NCCL
  refuses: ringtrain's engine moves their CUDA tensors through host memory, DDP uses gloo;
- ``cuda-2-own``: two ranks, each on its own GPU (NCCL); skipped with fewer than 2 GPUs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from tests.ranks import RankPool

#: Every placement, with the ``cuda`` mark on those that need a GPU.
PLACEMENTS = [
    pytest.param("cpu-1", id="cpu-1"),
    pytest.param("cpu-2", id="cpu-2"),
    pytest.param("cuda-1", id="cuda-1", marks=pytest.mark.cuda),
    pytest.param("cuda-2-shared", id="cuda-2-shared", marks=pytest.mark.cuda),
    pytest.param("cuda-2-own", id="cuda-2-own", marks=pytest.mark.cuda),
]
#: The placements of two ranks.
PAIRS = [p for p in PLACEMENTS if p.values[0].endswith(("-2", "-shared", "-own"))]
#: The CUDA placements only (tests of what only a GPU has: streams, GradScaler("cuda")).
CUDA_PLACEMENTS = [p for p in PLACEMENTS if p.values[0].startswith("cuda")]


@dataclass(frozen=True)
class Placement:
    """One placement: ``kind`` is ``cpu`` or ``cuda``; ``pool`` runs functions on its ranks."""

    name: str
    kind: str
    size: int
    pool: RankPool

    @property
    def shared_gpu(self) -> bool:
        return self.name == "cuda-2-shared"


def first_visible_gpu() -> str:
    """The first GPU this process may use, as ``CUDA_VISIBLE_DEVICES`` names it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return visible.split(",")[0] if visible else "0"


def pool_env(name: str) -> dict[str, str]:
    """The extra environment of a placement's ranks."""
    if name == "cuda-2-shared":
        return {"CUDA_VISIBLE_DEVICES": first_visible_gpu()}
    return {}


def size_of(name: str) -> int:
    return 1 if name.endswith("-1") else 2


def skip_unless_placeable(name: str) -> None:
    """Skip a placement this machine cannot give (the ``cuda`` mark already covers no GPU at all)."""
    if name == "cuda-2-own" and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs (one per rank, NCCL across devices); torch sees "
                    f"{torch.cuda.device_count()}. HINT: run on a machine with 2 or more GPUs")


# --- used inside the ranks ----------------------------------------------------------------------

def rank_device(kind: str) -> torch.device:
    """This rank's device, pinned by local rank as ringtrain pins it (``cuda:local_rank % GPUs``)."""
    if kind == "cpu":
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def mismatch(name: str, got: torch.Tensor, want: torch.Tensor, atol: float = 0.0,
             rtol: float = 0.0) -> str | None:
    """A line naming what differs between ``got`` and ``want`` (compared on the CPU), or None."""
    if not isinstance(got, torch.Tensor):
        return f"{name}: got {type(got).__name__}, expected a tensor"
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype}, expected {want.dtype}"
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    a, b = got.detach().cpu(), want.detach().cpu()
    if a.dtype == torch.bool or (atol == 0.0 and rtol == 0.0):
        same = torch.equal(a, b)
    else:
        same = torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol)
    if same:
        return None
    return f"{name}: got {a.flatten()[:6].tolist()}..., expected {b.flatten()[:6].tolist()}..."
