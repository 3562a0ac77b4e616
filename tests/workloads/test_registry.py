"""The registry and the contract every workload keeps (the Trainer and the CLI rely on it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import ringtrain.workloads as workloads
from ringtrain.workloads import WORKLOADS, DataError, Defaults, get_workload

OFFLINE = ["mnist", "synthetic", "synthetic-ratings"]


def test_public_names() -> None:
    assert workloads.__all__ == sorted(workloads.__all__)
    assert set(workloads.__all__) == {"WORKLOADS", "DataError", "Defaults", "TensorPairDataset", "Workload",
                                      "get_workload"}


def test_the_built_in_names() -> None:
    assert set(WORKLOADS) == {"mnist", "fashion-mnist", "cifar10", "movielens", "synthetic",
                              "synthetic-ratings"}
    for name in WORKLOADS:
        assert get_workload(name).name == name


@pytest.mark.parametrize("error", [KeyError, ValueError])
def test_unknown_name_lists_the_valid_ones(error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        get_workload("imagenet")
    message = str(info.value)
    assert message.startswith("unknown workload 'imagenet'")
    assert "cifar10, fashion-mnist, mnist, movielens, synthetic" in message


def test_data_error_is_a_value_error() -> None:
    assert issubclass(DataError, ValueError)


def test_get_workload_returns_a_fresh_instance() -> None:
    assert get_workload("mnist") is not get_workload("mnist")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_contract(name: str) -> None:
    wl = get_workload(name)
    assert wl.task in ("classification", "regression")
    assert wl.metric == {"classification": "accuracy", "regression": "rmse"}[wl.task]
    assert isinstance(wl.defaults, Defaults)
    with pytest.raises(dataclasses.FrozenInstanceError):
        wl.defaults.lr = 1.0  # type: ignore[misc]
    assert isinstance(wl.model(), nn.Module)
    assert isinstance(wl.loss(), nn.Module)
    assert wl.description
    with pytest.raises(ValueError, match="HINT:"):
        wl.model("no-such-arch")


@pytest.mark.parametrize("name", OFFLINE)
def test_items_feed_the_model_and_the_loss(name: str) -> None:
    wl = get_workload(name)
    train, _ = wl.datasets(subset=8)
    loader = torch.utils.data.DataLoader(train, batch_size=4)
    features, target = next(iter(loader))
    model = wl.model()
    out = model(*features) if isinstance(features, (tuple, list)) else model(features)
    loss = wl.loss()(out, target)
    assert loss.ndim == 0
    assert torch.isfinite(loss)


@pytest.mark.parametrize(
    "kwargs",
    [{"optimizer": "rmsprop"}, {"epochs": 0}, {"batch_size": 0}, {"lr": 0.0}],
)
def test_defaults_validate(kwargs: dict[str, object]) -> None:
    values = {"epochs": 1, "batch_size": 1, "lr": 0.1} | kwargs
    with pytest.raises(ValueError, match="HINT:"):
        Defaults(**values)  # type: ignore[arg-type]
