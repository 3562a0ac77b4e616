"""SyncBatchNorm on CPU and CUDA tensors: each rank's slice of a global batch normalizes as the whole
batch would under plain BatchNorm (output, running statistics, input gradient, local weight gradient)."""

from __future__ import annotations

import torch
from torch import nn

import ringtrain as hvd
from tests.engine.hvd_env import fresh
from tests.gpu.placements import Placement, mismatch, rank_device

PER_RANK = 4


def _global_batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs of every rank (N, C, H, W) and the weights of the loss ``sum(out * W)``."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(size * PER_RANK, 3, 5, 5, generator=gen) * 2 + 5  # a large mean tests the combining
    return x, torch.randn(x.shape, generator=gen)


def _affine(bn: nn.Module) -> None:
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))


def _sync_bn(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank, size = hvd.rank(), hvd.size()
        x, w = _global_batch(size)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        bn = hvd.SyncBatchNorm(3).to(device)
        _affine(bn)
        inputs = x[mine].to(device).requires_grad_()
        out = bn(inputs)
        (out * w[mine].to(device)).sum().backward()
        return {"out": out.detach().cpu(), "grad": inputs.grad.cpu(), "weight_grad": bn.weight.grad.cpu(),
                "bias_grad": bn.bias.grad.cpu(), "running_mean": bn.running_mean.cpu(),
                "running_var": bn.running_var.cpu(), "device": str(out.device)}
    finally:
        hvd.shutdown()


def test_sync_batch_norm_normalizes_over_the_global_batch(placement: Placement) -> None:
    results = placement.pool.run(_sync_bn, placement.kind)
    x, w = _global_batch(placement.size)
    reference = nn.BatchNorm2d(3)
    _affine(reference)
    inputs = x.clone().requires_grad_()
    out = reference(inputs)
    (out * w).sum().backward()
    mean = x.mean((0, 2, 3), keepdim=True)
    xhat = (x - mean) / torch.sqrt(x.var((0, 2, 3), unbiased=False, keepdim=True) + reference.eps)
    for rank, result in enumerate(results):
        assert result["device"].startswith(placement.kind)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        checks = [
            ("output", result["out"], out[mine].detach()),
            ("input gradient", result["grad"], inputs.grad[mine]),
            # weight and bias gradients stay local: the optimizer averages them like any other
            ("weight gradient", result["weight_grad"], (w[mine] * xhat[mine]).sum((0, 2, 3))),
            ("bias gradient", result["bias_grad"], w[mine].sum((0, 2, 3))),
            ("running mean", result["running_mean"], reference.running_mean),
            ("running var", result["running_var"], reference.running_var),
        ]
        for name, got, want in checks:
            assert mismatch(f"rank {rank} {name}", got, want, atol=1e-4, rtol=1e-4) is None
