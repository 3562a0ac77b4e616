"""Strategies: DDP and Horovod on one process and on two real ranks (sum, wrapping, gradient sync)."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from ringtrain.train.strategies import (
    STRATEGIES,
    DDPStrategy,
    HorovodStrategy,
    make_strategy,
    pick_device,
)

#: Variables by which a launcher or scheduler would make this test process a rank of some job.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "HOROVOD_RANK",
                      "SLURM_JOB_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                      "PBS_JOBID", "LSB_JOBID")


@pytest.fixture
def alone(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_make_strategy_by_name():
    strategy = make_strategy("horovod", device="cpu", fp16_allreduce=True, batches_per_allreduce=4)
    assert type(strategy) is HorovodStrategy
    assert (strategy.requested_device, strategy.fp16_allreduce) == ("cpu", True)
    assert strategy.batches_per_allreduce == 4
    assert type(make_strategy("ddp")) is DDPStrategy
    assert sorted(STRATEGIES) == ["ddp", "horovod"]


def test_an_unknown_strategy_names_the_choices():
    with pytest.raises(ValueError, match=r"strategy='deepspeed' is not known. HINT: .*\['ddp', 'horovod'\]"):
        make_strategy("deepspeed")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_pick_device_without_cuda():
    assert pick_device(None, 3) == torch.device("cpu")
    assert pick_device("cpu", 0) == torch.device("cpu")
    with pytest.raises(ValueError, match="device='cuda' was asked for but torch sees no CUDA device. HINT:"):
        pick_device("cuda", 0)


def _model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.5)


@pytest.mark.parametrize("name", ["ddp", "horovod"])
def test_a_world_of_one(name, alone):
    strategy = make_strategy(name, device="cpu")
    strategy.setup()
    try:
        assert (strategy.rank, strategy.world_size, strategy.local_rank) == (0, 1, 0)
        model, optimizer = _model_and_optimizer(0)
        wrapped_model, wrapped_optimizer = strategy.prepare(model, optimizer)
        assert strategy.unwrap(wrapped_model) is model
        value = torch.tensor([1.0, 2.0])
        total = strategy.sum(value)
        assert torch.equal(total, value)
        assert total is not value
        before = model.weight.detach().clone()
        with strategy.accumulating(wrapped_model, sync=True):
            wrapped_model(torch.ones(4, 3)).sum().backward()
        strategy.step(wrapped_optimizer, None)
        assert not torch.equal(model.weight, before)
    finally:
        strategy.teardown()


def _train_two_ranks(name: str) -> dict:
    """Different initial weights and data on each rank; the strategy must make the models agree."""
    strategy = make_strategy(name, device="cpu")
    strategy.setup()
    try:
        rank = strategy.rank
        model, optimizer = _model_and_optimizer(seed=rank)  # deliberately different starting points
        model, optimizer = strategy.prepare(model, optimizer)
        inputs = torch.full((4, 3), float(rank + 1))
        with strategy.accumulating(model, sync=True):
            model(inputs).sum().backward()
        strategy.step(optimizer, None)  # Horovod averages the gradients in here, DDP during backward
        result = {"rank": rank, "size": strategy.world_size, "wrapped": type(model).__name__,
                  "grad": strategy.unwrap(model).weight.grad.clone(),
                  "weights": strategy.unwrap(model).weight.detach().clone(),
                  "sum": strategy.sum(torch.tensor([float(rank + 1)])).item()}
        del model, optimizer  # the contract of teardown(): no DDP wrapper may outlive its process group
        return result
    finally:
        gc.collect()
        strategy.teardown()


@pytest.mark.parametrize("name", ["ddp", "horovod"])
def test_two_ranks_agree(name, ranks2):
    results = ranks2.run(_train_two_ranks, name)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 for r in results)
    assert all(r["sum"] == 3.0 for r in results)  # 1 + 2
    # the gradient of sum(W x) is x per output row: the mean of rank inputs 1 and 2 is 1.5 everywhere
    for r in results:
        assert torch.allclose(r["grad"], torch.full((2, 3), 1.5 * 4))
    assert torch.equal(results[0]["weights"], results[1]["weights"])
    assert results[0]["wrapped"] == ("DistributedDataParallel" if name == "ddp" else "Linear")
