"""op=hvd.Adasum on real ranks, against a plain computation of Horovod's rule in one process."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import ringtrain as hvd
from tests.engine.hvd_env import ensure_init, fresh

FLOOR = sys.float_info.min**0.5


def _pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's rule for two vectors: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b."""
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * aa) if aa >= FLOOR else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb >= FLOOR else 1.0
    return ca * a + cb * b


def reference(vectors: list[np.ndarray]) -> np.ndarray:
    """Recursive pairwise over ranks in order: the left subtree is the largest power of two below n
    (a power-of-two size is Horovod's tree; other sizes read as padded with zero vectors)."""
    if len(vectors) == 1:
        return vectors[0]
    half = 1
    while half * 2 < len(vectors):
        half *= 2
    return _pair(reference(vectors[:half]), reference(vectors[half:]))


def _vector(rank: int, index: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * index + rank)
    # A shared direction plus noise: neither orthogonal nor parallel, so both coefficients matter.
    common = torch.randn(numel, generator=torch.Generator().manual_seed(index), dtype=torch.float64)
    return (common + 0.7 * torch.randn(numel, generator=gen, dtype=torch.float64)).to(dtype)


SIZES = [1, 7, 1000, 70001]  # 70001 float64 elements: larger than the sockets' buffers


def adasum_results(dtype_name: str, grouped: bool, env: dict[str, str]) -> dict:
    fresh(env) if env else ensure_init()
    dtype = getattr(torch, dtype_name)
    inputs = [_vector(hvd.rank(), i, n, dtype) for i, n in enumerate(SIZES)]
    if grouped:
        outputs = hvd.grouped_allreduce(inputs, name="ada.grouped", op=hvd.Adasum)
    else:
        handles = [hvd.allreduce_async(t, name=f"ada.{i}", op=hvd.Adasum) for i, t in enumerate(inputs)]
        outputs = [hvd.synchronize(h) for h in handles]
    in_place = inputs[2].clone()
    hvd.allreduce_(in_place, name="ada.inplace", op=hvd.Adasum)
    return {"outputs": outputs, "in_place": in_place, "size": hvd.size()}


def _check(results: list[dict], dtype: torch.dtype, tol: float) -> None:
    size = results[0]["size"]
    for i, numel in enumerate(SIZES):
        vectors = [_vector(r, i, numel, dtype).to(torch.float64).numpy() for r in range(size)]
        want = torch.from_numpy(reference(vectors))
        for result in results:
            got = result["outputs"][i].to(torch.float64)
            torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))
            if i == 2:  # alone, not fused: the dot products add up in another order
                torch.testing.assert_close(result["in_place"].to(torch.float64), want, rtol=tol,
                                           atol=tol * float(want.abs().max()))
        for result in results[1:]:
            # Every element is computed on one rank and copied: bit-identical everywhere.
            assert torch.equal(result["outputs"][i], results[0]["outputs"][i])


@pytest.mark.parametrize("pool", ["ranks2", "ranks3", "ranks4"])
@pytest.mark.parametrize("grouped", [False, True], ids=["single", "grouped"])
def test_adasum_matches_the_rule(request, pool, grouped):
    results = request.getfixturevalue(pool).run(adasum_results, "float64", grouped, {})
    _check(results, torch.float64, 1e-12)


@pytest.mark.parametrize(("dtype", "tol"),
                         [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_adasum_low_precision(ranks3, dtype, tol):
    results = ranks3.run(adasum_results, str(dtype).replace("torch.", ""), True, {})
    _check(results, dtype, tol)


@pytest.mark.parametrize("env", [{"RINGTRAIN_CPU_ALLREDUCE": "gloo"}, {"RINGTRAIN_CONTROL_PLANE": "gloo"}],
                         ids=["gloo-data", "gloo-everything"])
def test_adasum_over_gloo(ranks3, env):
    _check(ranks3.run(adasum_results, "float64", False, env), torch.float64, 1e-12)


def special_cases() -> dict:
    ensure_init()
    size, rank = hvd.size(), hvd.rank()
    # Orthogonal vectors add up; parallel ones (power-of-two sizes) average.
    basis = torch.eye(size, dtype=torch.float64)
    orthogonal = hvd.allreduce(basis[rank] * (rank + 1), name="ada.orth", op=hvd.Adasum)
    direction = torch.linspace(-1, 1, 9, dtype=torch.float64)
    parallel = hvd.allreduce(direction * (rank + 1), name="ada.par", op=hvd.Adasum)
    # A rank with a zero vector passes the others through; all zeros stay zero.
    lone = hvd.allreduce(direction if rank == 0 else torch.zeros(9, dtype=torch.float64), name="ada.zero",
                         op=hvd.Adasum)
    zeros = hvd.allreduce(torch.zeros(4), name="ada.zeros", op=hvd.Adasum)
    # Scale factors apply before and after the reduction, as for the other ops.
    scaled = hvd.allreduce(basis[rank], name="ada.scaled", op=hvd.Adasum, prescale_factor=2.0,
                           postscale_factor=0.25)
    # Differentiable: the gradient is the Adasum of the gradients.
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    (hvd.allreduce(x, name="ada.grad", op=hvd.Adasum) * (rank + 1)).sum().backward()
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
        int_error = ""
    except ValueError as exc:
        int_error = str(exc)
    return {"orthogonal": orthogonal, "parallel": parallel, "lone": lone, "zeros": zeros, "scaled": scaled,
            "grad": x.grad, "int_error": int_error, "size": size, "direction": direction}


@pytest.mark.parametrize("pool", ["ranks2", "ranks3", "ranks4"])
def test_adasum_special_cases(request, pool):
    results = request.getfixturevalue(pool).run(special_cases)
    size = results[0]["size"]
    direction = results[0]["direction"]
    grad_vectors = [np.full(3, r + 1.0) for r in range(size)]
    for result in results:
        assert result["orthogonal"].tolist() == [float(r + 1) for r in range(size)]
        want = reference([direction.numpy() * (r + 1) for r in range(size)])
        torch.testing.assert_close(result["parallel"], torch.from_numpy(want))
        if size in (2, 4):
            torch.testing.assert_close(result["parallel"], direction * (size + 1) / 2)
        torch.testing.assert_close(result["lone"], direction)
        assert result["zeros"].tolist() == [0.0] * 4
        torch.testing.assert_close(result["scaled"], torch.full((size,), 0.5, dtype=torch.float64))
        torch.testing.assert_close(result["grad"], torch.from_numpy(reference(grad_vectors)))
        assert "needs floating-point tensors; got torch.int32" in result["int_error"]
        assert "HINT:" in result["int_error"]


def process_set_adasum() -> dict:
    fresh(process_sets="dynamic")
    odd = hvd.add_process_set([1, 2])
    out = None
    if hvd.rank() in (1, 2):
        out = hvd.allreduce(_vector(hvd.rank(), 3, 50, torch.float64), name="ada.set", op=hvd.Adasum,
                            process_set=odd)
    hvd.barrier()
    return {"out": out}


def test_adasum_in_a_process_set(ranks3):
    results = ranks3.run(process_set_adasum)
    want = torch.from_numpy(reference([_vector(r, 3, 50, torch.float64).numpy() for r in (1, 2)]))
    assert results[0]["out"] is None
    for result in results[1:]:
        torch.testing.assert_close(result["out"], want)
