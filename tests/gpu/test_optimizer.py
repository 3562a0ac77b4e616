"""DistributedOptimizer, GradScaler and the start-of-training broadcasts on CPU and CUDA tensors.

Gradients accumulated over ``backward_passes_per_step`` and averaged (plain, fp16, bf16 on the wire);
a GradScaler with ``synchronize()`` / ``skip_synchronize()``, where an overflow on one rank makes every
rank skip the step; parameters and optimizer state broadcast from rank 0 stay on the device; PowerSGD
(``hvd.Compression.powersgd``) on the device, its state there too, 16-bit parameters in float32;
sharded optimizer state (``shard_optimizer_state=True``) on the device: the unsharded steps, each
rank's state there, its shards consolidated, and a GradScaler("cuda") overflow on one rank.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ringtrain as hvd
from tests.engine.hvd_env import fresh
from tests.gpu.placements import Placement, mismatch, rank_device


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)


def _loss(model: nn.Module, rank: int, step: int, device: torch.device) -> torch.Tensor:
    x, y = _batch(rank, step)
    return nn.functional.mse_loss(model(x.to(device)), y.to(device))


def _reference_params(size: int, passes: int, lr: float) -> list[torch.Tensor]:
    """Parameters after one SGD step on gradients summed over passes and averaged over ranks (CPU)."""
    total = None
    for rank in range(size):
        model = _model()
        for p in range(passes):
            _loss(model, rank, p, torch.device("cpu")).backward()
        grads = [q.grad.clone() for q in model.parameters()]
        total = grads if total is None else [a + b for a, b in zip(total, grads)]
    model = _model()
    return [(q - lr * g / size).detach() for q, g in zip(model.parameters(), total)]


def _accumulated_step(kind: str, compression: str, passes: int) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank = hvd.rank()
        model = _model().to(device)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=getattr(hvd.Compression, compression),
                                       backward_passes_per_step=passes)
        for p in range(passes):
            _loss(model, rank, p, device).backward()
        opt.step()
        after_one = [q.detach().cpu().clone() for q in model.parameters()]
        devices = sorted({str(q.grad.device) for q in model.parameters()})
        opt.zero_grad()
        for p in range(passes):  # a second step: the pass counters were reset
            _loss(model, rank, passes + p, device).backward()
        opt.step()
        return {"params": after_one, "second": [q.detach().cpu() for q in model.parameters()],
                "grad_devices": devices, "device": str(device)}
    finally:
        hvd.shutdown()


@pytest.mark.parametrize(("compression", "tolerance"), [("none", 1e-6), ("fp16", 1e-3), ("bf16", 1e-2)])
def test_accumulated_gradients_are_averaged_on_the_device(placement: Placement, compression: str,
                                                         tolerance: float) -> None:
    passes = 2
    results = placement.pool.run(_accumulated_step, placement.kind, compression, passes)
    want = _reference_params(placement.size, passes, lr=0.1)
    for rank, result in enumerate(results):
        assert result["grad_devices"] == [result["device"]]
        for i, (got, expected) in enumerate(zip(result["params"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=tolerance, rtol=tolerance) is None
        for got, first in zip(result["second"], results[0]["second"]):
            assert torch.equal(got, first)  # every rank took the same second step


def _scaled_steps(kind: str, shard: bool = False) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank = hvd.rank()
        model = _model().to(device)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       shard_optimizer_state=shard)
        scaler = torch.amp.GradScaler(device.type, init_scale=1024.0)

        def step(number: int, poison: bool, autocast: bool) -> None:
            context = (torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda"
                                      else torch.bfloat16) if autocast else torch.autocast(device.type,
                                                                                           enabled=False))
            with context:
                loss = _loss(model, rank, number, device)
            if poison:
                loss = loss * float("inf")
            scaler.scale(loss).backward()
            opt.synchronize()  # averaged before the scaler looks for inf/nan
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
            opt.zero_grad()

        step(0, poison=False, autocast=False)
        first = [q.detach().cpu().clone() for q in model.parameters()]
        scale_before = scaler.get_scale()
        step(1, poison=rank == 0, autocast=True)  # rank 0 overflows: every rank must skip
        skipped = [q.detach().cpu().clone() for q in model.parameters()]
        scale_after = scaler.get_scale()
        step(2, poison=False, autocast=True)
        return {"first": first, "skipped": skipped, "scales": (scale_before, scale_after),
                "last": [q.detach().cpu() for q in model.parameters()]}
    finally:
        hvd.shutdown()


def test_grad_scaler_with_synchronize_and_an_overflow_on_one_rank(placement: Placement) -> None:
    results = placement.pool.run(_scaled_steps, placement.kind)
    want = _reference_params(placement.size, passes=1, lr=0.1)
    for rank, result in enumerate(results):
        for i, (got, expected) in enumerate(zip(result["first"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=1e-6, rtol=1e-6) is None
        for got, before in zip(result["skipped"], result["first"]):
            assert torch.equal(got, before), f"rank {rank} stepped on an overflow"
        assert result["scales"] == (1024.0, 512.0)
        changed = any(not torch.equal(a, b) for a, b in zip(result["last"], result["skipped"]))
        assert changed, f"rank {rank} did not step after the overflow"
        for got, first in zip(result["last"], results[0]["last"]):
            assert torch.equal(got, first)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.bn = nn.BatchNorm2d(4)  # buffers too, one of them int64
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).mean((2, 3)))


def _broadcast_state(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank = hvd.rank()
        torch.manual_seed(rank)  # every rank starts elsewhere
        model = _Net().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1))
        model(torch.randn(3, 2, 6, 6, device=device)).sum().backward()
        opt.step()  # state of its own on every rank
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        state = {f"{i}.{k}": v for i, s in enumerate(opt.state.values()) for k, v in s.items()}
        return {"model": {k: v.cpu() for k, v in model.state_dict().items()},
                "model_devices": sorted({str(v.device) for v in model.state_dict().values()}),
                "state": {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()},
                "state_devices": {k: str(v.device) for k, v in state.items() if torch.is_tensor(v)},
                "lr": opt.param_groups[0]["lr"], "device": str(device)}
    finally:
        hvd.shutdown()


def test_parameters_and_optimizer_state_broadcast_from_the_device(placement: Placement) -> None:
    results = placement.pool.run(_broadcast_state, placement.kind)
    root = results[0]
    for rank, result in enumerate(results):
        assert result["model_devices"] == [result["device"]]
        assert result["lr"] == root["lr"] == 0.01
        for key, value in root["model"].items():
            assert torch.equal(result["model"][key], value), f"rank {rank}: {key}"
        for key, value in root["state"].items():
            got = result["state"][key]
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value, f"rank {rank}: {key}"
        for key, where in result["state_devices"].items():
            # moments live with their parameters; Adam keeps its step count on the CPU
            assert where == ("cpu" if key.endswith(".step") else result["device"]), key


# --- PowerSGD ----------------------------------------------------------------------------------

def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 24), nn.ReLU(), nn.Linear(24, 16))


def _mlp_loss(model: nn.Module, rank: int, step: int, device: torch.device) -> torch.Tensor:
    # two samples per rank: each weight's gradient has rank <= 2, their average over 2 ranks <= 4
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(2, 32, generator=gen), torch.randn(2, 16, generator=gen)
    dtype = next(model.parameters()).dtype
    return nn.functional.mse_loss(model(x.to(device, dtype)), y.to(device, dtype))


def _mlp_reference(size: int, steps: int, lr: float, dtype: str = "float32") -> list[torch.Tensor]:
    """Parameters after ``steps`` SGD steps on gradients averaged over ranks, uncompressed (CPU)."""
    model = _mlp().to(getattr(torch, dtype))
    for step in range(steps):
        grads = None
        for rank in range(size):
            model.zero_grad()
            _mlp_loss(model, rank, step, torch.device("cpu")).backward()
            mine = [q.grad.clone() for q in model.parameters()]
            grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
        with torch.no_grad():
            for q, g in zip(model.parameters(), grads):
                q -= lr * g / size
    return [q.detach().double() for q in model.parameters()]


def _powersgd_steps(kind: str, dtype: str, steps: int) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        model = _mlp().to(device=device, dtype=getattr(torch, dtype))
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(),
                                       compression=hvd.Compression.powersgd(rank=4, start_iter=1))
        for step in range(steps):  # one plain step, then compressed ones
            opt.zero_grad()
            _mlp_loss(model, hvd.rank(), step, device).backward()
            opt.step()
        state = opt._powersgd.state
        return {"params": [q.detach().double().cpu() for q in model.parameters()],
                "grad_dtypes": sorted({str(q.grad.dtype) for q in model.parameters()}),
                "state_devices": sorted({str(t.device) for t in [*state.q.values(), *state.errors.values()]}),
                "compressed": sorted(state.errors), "device": str(device)}
    finally:
        hvd.shutdown()


@pytest.mark.parametrize(("dtype", "tolerance"), [("float64", 1e-9), ("float32", 1e-4)])
def test_powersgd_averages_low_rank_gradients_on_the_device(placement: Placement, dtype: str,
                                                            tolerance: float) -> None:
    # exact up to rounding: in float64 to 1e-9; in float32 QR of a poorly conditioned P (the warm start
    # at a poor angle to a new gradient's rows) loses digits, about 1e-4 of a gradient here
    steps = 4
    results = placement.pool.run(_powersgd_steps, placement.kind, dtype, steps)
    want = _mlp_reference(placement.size, steps, lr=0.1, dtype=dtype)
    for rank, result in enumerate(results):
        assert result["grad_dtypes"] == [f"torch.{dtype}"]
        if placement.size > 1:  # one rank communicates nothing, so PowerSGD has nothing to do
            assert result["compressed"] == ["0.weight", "2.weight"]
            assert result["state_devices"] == [result["device"]]
        for i, (got, expected) in enumerate(zip(result["params"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=tolerance, rtol=tolerance) is None
        for got, first in zip(result["params"], results[0]["params"]):
            assert torch.equal(got, first)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_powersgd_on_16_bit_parameters_works_in_float32_on_the_gpu(cuda_placement: Placement,
                                                                   dtype: str) -> None:
    steps = 3
    results = cuda_placement.pool.run(_powersgd_steps, cuda_placement.kind, dtype, steps)
    want = _mlp_reference(cuda_placement.size, steps, lr=0.1)
    tolerance = 3e-2 if dtype == "bfloat16" else 5e-3
    for rank, result in enumerate(results):
        assert result["grad_dtypes"] == [f"torch.{dtype}"]
        for i, (got, expected) in enumerate(zip(result["params"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=tolerance, rtol=tolerance) is None
        for got, first in zip(result["params"], results[0]["params"]):
            assert torch.equal(got, first)


# --- sharded optimizer state -----------------------------------------------------------------------

def _sharded_adam(kind: str, shard: bool) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        model = _model().to(device)
        opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters(), shard_optimizer_state=shard)
        for step in range(4):
            opt.zero_grad()
            _loss(model, hvd.rank(), step, device).backward()
            opt.step()
        moments = [t for entry in opt.state.values() for key, t in entry.items() if key != "step"]

        def cpu(value: object) -> object:
            if isinstance(value, torch.Tensor):
                return value.cpu()
            if isinstance(value, dict):
                return {k: cpu(v) for k, v in value.items()}
            return value

        return {"params": [q.detach().cpu().clone() for q in model.parameters()],
                "held": sorted(opt._parameter_names[q] for q in opt.state),
                "state_devices": sorted({str(t.device) for t in moments}),
                "state_dict": cpu(opt.state_dict()), "device": str(device)}
    finally:
        hvd.shutdown()


def test_sharded_adam_on_the_device_takes_the_unsharded_steps(cuda_placement: Placement) -> None:
    from ringtrain.sharding import consolidate

    plain = cuda_placement.pool.run(_sharded_adam, cuda_placement.kind, False)
    sharded = cuda_placement.pool.run(_sharded_adam, cuda_placement.kind, True)
    names = {name for name, _ in _model().named_parameters()}
    assert set().union(*(set(r["held"]) for r in sharded)) == names
    assert sum(len(r["held"]) for r in sharded) == len(names)  # each parameter's state on one rank
    for rank, result in enumerate(sharded):
        assert result["state_devices"] == [result["device"]]
        for i, (got, want) in enumerate(zip(result["params"], plain[rank]["params"])):
            assert mismatch(f"rank {rank} param {i}", got, want, atol=1e-6, rtol=1e-6) is None
        for got, first in zip(result["params"], sharded[0]["params"]):
            assert torch.equal(got, first)
    whole = consolidate([r["state_dict"] for r in sharded])
    want = plain[0]["state_dict"]
    assert whole["state"].keys() == want["state"].keys()
    for index, entry in want["state"].items():
        for key, value in entry.items():
            assert mismatch(f"state {index}.{key}", whole["state"][index][key], value, atol=1e-6,
                            rtol=1e-5) is None


def test_sharded_state_with_grad_scaler_and_an_overflow_on_one_rank(cuda_placement: Placement) -> None:
    results = cuda_placement.pool.run(_scaled_steps, cuda_placement.kind, True)
    want = _reference_params(cuda_placement.size, passes=1, lr=0.1)
    for rank, result in enumerate(results):
        for i, (got, expected) in enumerate(zip(result["first"], want)):
            assert mismatch(f"rank {rank} param {i}", got, expected, atol=1e-6, rtol=1e-6) is None
        for got, before in zip(result["skipped"], result["first"]):
            assert torch.equal(got, before), f"rank {rank} stepped on an overflow"
        assert result["scales"] == (1024.0, 512.0)
        for got, first in zip(result["last"], results[0]["last"]):
            assert torch.equal(got, first)
