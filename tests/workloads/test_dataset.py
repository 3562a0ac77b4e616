"""The in-memory dataset: items, tuples of features, selection, seeded subsets."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from ringtrain.workloads import TensorPairDataset
from ringtrain.workloads.dataset import check_subset, take_subset


def _pairs(n: int = 10) -> TensorPairDataset:
    return TensorPairDataset((torch.arange(n), torch.arange(n) * 10), torch.arange(n).float() / 2)


def test_items_of_single_and_tuple_features() -> None:
    single = TensorPairDataset(torch.arange(12).view(6, 2), torch.arange(6), classes=("a", "b"))
    x, y = single[4]
    assert x.tolist() == [8, 9]
    assert y.item() == 4
    (u, m), r = _pairs()[3]
    assert (u.item(), m.item(), r.item()) == (3, 30, 1.5)
    assert len(single) == 6
    assert "items=6" in repr(single)


def test_misaligned_tensors_are_a_bug() -> None:
    with pytest.raises(AssertionError, match="differ in length"):
        TensorPairDataset((torch.zeros(3), torch.zeros(4)), torch.zeros(3))


def test_select_keeps_the_given_order() -> None:
    chosen = _pairs().select(torch.tensor([7, 2]))
    assert chosen.features[0].tolist() == [7, 2]
    assert chosen.features[1].tolist() == [70, 20]
    assert chosen.targets.tolist() == [3.5, 1.0]


def test_default_dataloader_batches_tuple_features() -> None:
    features, targets = next(iter(DataLoader(_pairs(), batch_size=4)))
    users, items = features
    assert users.tolist() == [0, 1, 2, 3]
    assert items.tolist() == [0, 10, 20, 30]
    assert targets.shape == (4,)


def test_take_subset() -> None:
    ds = _pairs(100)
    a = take_subset(ds, 10, seed=3)
    b = take_subset(ds, 10, seed=3)
    assert len(a) == 10
    assert torch.equal(a.features[0], b.features[0])
    assert a.features[0].tolist() == sorted(a.features[0].tolist())  # original order kept
    assert take_subset(ds, 1000, seed=0) is ds
    assert take_subset(ds, None, seed=0) is ds


def test_check_subset() -> None:
    check_subset(None)
    check_subset(5)
    with pytest.raises(ValueError, match="subset=0"):
        check_subset(0)
