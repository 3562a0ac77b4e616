"""LocalSGD on CPU and CUDA tensors: DiLoCo's averagings over ringtrain's engine and over torch.distributed
(NCCL where each rank has its own GPU, gloo otherwise) match the CPU reference, the anchor and the outer
momentum stay on the device, and a GradScaler("cuda") that skips a step on one rank keeps the ranks in step.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ringtrain as hvd
from tests.engine.hvd_env import fresh
from tests.gpu.placements import Placement, mismatch, rank_device
from tests.test_local_sgd import _batch, _local_sgd_reference, _model


def _train_on(device: torch.device, rank: int, compression: str, steps: int) -> dict:
    model = _model().to(device)
    opt = hvd.LocalSGD.diloco(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                              compression=compression)
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        opt.step()
    outer = opt.outer_optimizer
    return {"params": [p.detach().cpu() for p in model.parameters()], "device": str(device),
            "devices": sorted({str(p.device) for p in model.parameters()}
                              | {str(a.device) for a in outer.param_groups[0]["params"]}
                              | {str(s["momentum_buffer"].device) for s in outer.state.values()})}


def _engine_steps(kind: str, compression: str, steps: int) -> dict:
    fresh()
    try:
        return _train_on(rank_device(kind), hvd.rank(), compression, steps)
    finally:
        hvd.shutdown()


def _torch_steps(kind: str, nccl: bool, steps: int) -> dict:
    hvd.shutdown()  # a pool's engine from an earlier test: this one is torch.distributed's
    device = rank_device(kind)
    dist.init_process_group("nccl" if nccl else "gloo")
    try:
        return _train_on(device, dist.get_rank(), "none", steps)
    finally:
        dist.destroy_process_group()


def _check(placement: Placement, results: list[dict], steps: int, tolerance: float) -> None:
    want = _local_sgd_reference(placement.size, steps, 2, lr=0.1, outer_lr=0.7, momentum=0.9)
    for rank, result in enumerate(results):
        assert result["devices"] == [result["device"]]  # parameters, anchor, outer momentum
        for i, (got, expected) in enumerate(zip(result["params"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=tolerance, rtol=tolerance) is None
        for got, first in zip(result["params"], results[0]["params"]):
            assert torch.equal(got, first)  # every rank applied the same mean


@pytest.mark.parametrize(("compression", "tolerance"), [("none", 1e-5), ("fp16", 2e-3)])
def test_diloco_over_the_engine_on_the_device(placement: Placement, compression: str,
                                              tolerance: float) -> None:
    steps = 4
    _check(placement, placement.pool.run(_engine_steps, placement.kind, compression, steps), steps, tolerance)


def test_diloco_over_torch_distributed_on_the_device(placement: Placement) -> None:
    steps = 4
    # NCCL refuses two ranks on one GPU: those use gloo, as the Trainer's DDP does
    nccl = placement.kind == "cuda" and not placement.shared_gpu
    _check(placement, placement.pool.run(_torch_steps, placement.kind, nccl, steps), steps, 1e-5)


def _scaled_steps(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank = hvd.rank()
        model = _model().to(device)
        opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
        scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)
        for step in range(4):
            x, y = _batch(rank, step)
            opt.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16):
                loss = nn.functional.mse_loss(model(x.to(device)).float(), y.to(device))
            if rank == 0 and step == 1:
                loss = loss * float("inf")  # only rank 0 skips this step
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return {"params": [p.detach().cpu() for p in model.parameters()], "steps": opt.steps,
                "syncs": opt.syncs}
    finally:
        hvd.shutdown()


@pytest.mark.cuda
def test_a_grad_scaler_skip_on_one_rank_keeps_the_ranks_in_step(cuda_placement: Placement) -> None:
    results = cuda_placement.pool.run(_scaled_steps, cuda_placement.kind, timeout=120)
    assert [(r["steps"], r["syncs"]) for r in results] == [(4, 2)] * cuda_placement.size
    for got, first in zip(results[-1]["params"], results[0]["params"]):
        assert torch.equal(got, first)
