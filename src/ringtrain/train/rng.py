"""Random number generator states as plain tensors, so snapshots load with ``weights_only=True``.

All states of one process become one int64 vector (torch CPU, numpy MT19937, Python's ``random``),
one float64 vector (the cached Gaussians) and one uint8 vector (the CUDA generator, empty on CPU):
fixed sizes, so the rows of all ranks can be gathered with a plain sum-allreduce.
"""

from __future__ import annotations

import random

import numpy as np
import torch

_TORCH_BYTES = torch.get_rng_state().numel()
_NUMPY_KEYS = 624
_PYTHON_WORDS = 625


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA), numpy and Python's ``random``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture() -> dict[str, torch.Tensor]:
    """This process's RNG states as ``{"ints", "floats", "cuda"}`` tensors."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    if np_name != "MT19937":
        raise AssertionError(f"numpy generator {np_name} is not MT19937")
    py_version, py_words, py_gauss = random.getstate()
    ints = torch.cat([
        torch.get_rng_state().to(torch.int64),
        torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
        torch.tensor([np_pos, np_has_gauss, py_version], dtype=torch.int64),
        torch.tensor(py_words, dtype=torch.int64),
    ])
    floats = torch.tensor([np_gauss, float("nan") if py_gauss is None else py_gauss], dtype=torch.float64)
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else torch.zeros(0, dtype=torch.uint8)
    return {"ints": ints, "floats": floats, "cuda": cuda.to(torch.int64)}


def restore(state: dict[str, torch.Tensor]) -> None:
    """Set this process's RNGs from a ``capture()`` result."""
    ints = state["ints"].to(torch.int64)
    floats = state["floats"].to(torch.float64)
    expected = _TORCH_BYTES + _NUMPY_KEYS + 3 + _PYTHON_WORDS
    if ints.numel() != expected:
        raise ValueError(f"RNG state has {ints.numel()} values, expected {expected}")
    torch_state, rest = ints[:_TORCH_BYTES], ints[_TORCH_BYTES:]
    torch.set_rng_state(torch_state.to(torch.uint8))
    keys, rest = rest[:_NUMPY_KEYS], rest[_NUMPY_KEYS:]
    np_pos, np_has_gauss, py_version = (int(v) for v in rest[:3])
    py_words = tuple(int(v) for v in rest[3:])
    np.random.set_state(("MT19937", keys.numpy().astype(np.uint32), np_pos, np_has_gauss, float(floats[0])))
    py_gauss = None if torch.isnan(floats[1]) else float(floats[1])
    random.setstate((py_version, py_words, py_gauss))
    cuda = state.get("cuda")
    if cuda is not None and cuda.numel() and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda.to(torch.uint8))
