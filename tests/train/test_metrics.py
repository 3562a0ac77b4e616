"""Metrics across ranks are weighted by item count and skip the DistributedSampler's padding."""

import math

import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

from ringtrain.train.config import TrainerConfig
from ringtrain.train.metrics import MetricTotals, real_items_in_batch
from ringtrain.workloads import TensorPairDataset


@pytest.mark.parametrize(("size", "world", "batch"),
                         [(7, 2, 2), (10, 3, 4), (5, 4, 1), (64, 2, 64), (3, 2, 8)])
def test_real_items_match_the_padded_sampler(size, world, batch):
    # count the real items the way the sampler hands them out: positions >= size repeat earlier items
    total_real = 0
    for rank in range(world):
        sampler = DistributedSampler(range(size), num_replicas=world, rank=rank, shuffle=False)
        positions = list(range(rank, len(sampler) * world, world))
        batches = [positions[i:i + batch] for i in range(0, len(positions), batch)]
        for b, chunk in enumerate(batches):
            expected = sum(1 for p in chunk if p < size)
            assert real_items_in_batch(size, world, rank, batch, b) == expected
            total_real += expected
    assert total_real == size


def test_totals_divide_last():
    totals = MetricTotals()
    totals.add(torch.tensor(1.0), torch.tensor([[0.0, 1.0]] * 3), torch.tensor([1, 1, 0]), "classification")
    totals.add(torch.tensor(4.0), torch.tensor([[1.0, 0.0]]), torch.tensor([0]), "classification")
    assert totals.count == 4
    assert totals.loss == pytest.approx((1.0 * 3 + 4.0) / 4)
    assert totals.accuracy == pytest.approx(3 / 4)


class Affine(nn.Module):
    """A fixed model whose per-item loss differs a lot between items."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def _uneven_data() -> TensorPairDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 2, generator=g) * 3
    y = torch.tensor([0, 1, 1, 0, 1, 0, 0])
    return TensorPairDataset(x, y)


def evaluate_on_rank(batch_size: int) -> tuple[float, float, float]:
    """Evaluate the fixed model on 7 items (not divisible by 2 ranks) and return the agreed metrics."""
    from ringtrain.train import Trainer

    torch.set_num_threads(1)
    data = _uneven_data()
    model = Affine()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), data, data,
                      TrainerConfig(batch_size=batch_size, progress=False))
    try:
        totals = trainer.evaluate()
    finally:
        trainer.close()
    return totals.loss, totals.accuracy, totals.count


def _single_process_reference() -> tuple[float, float]:
    data = _uneven_data()
    with torch.no_grad():
        out = Affine()(data.features)
    loss = nn.CrossEntropyLoss()(out, data.targets).item()
    accuracy = (out.argmax(1) == data.targets).float().mean().item()
    return loss, accuracy


@pytest.mark.parametrize("batch_size", [2, 3, 64])
def test_eval_metrics_over_uneven_shards_match_one_process(ranks2, batch_size):
    results = ranks2.run(evaluate_on_rank, batch_size, timeout=240)
    loss, accuracy = _single_process_reference()
    for got_loss, got_accuracy, count in results:
        assert count == 7  # 4 + 3 real items; the padded 8th is not counted
        assert got_loss == pytest.approx(loss, rel=1e-6)
        assert got_accuracy == pytest.approx(accuracy)
    assert not math.isnan(results[0][0])
