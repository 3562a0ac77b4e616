"""The recommenders: shapes, the bias terms, a start at the global mean."""

from __future__ import annotations

import torch

from ringtrain.workloads.models import BiasedMF, NeuralCF


def test_biased_mf_starts_near_the_global_mean() -> None:
    model = BiasedMF(10, 20, dim=8, global_mean=3.7).eval()
    users, items = torch.tensor([0, 9, 3]), torch.tensor([19, 0, 5])
    out = model(users, items)
    assert out.shape == (3,)
    assert torch.allclose(out, torch.full((3,), 3.7), atol=0.01)


def test_biased_mf_is_the_sum_of_its_terms() -> None:
    model = BiasedMF(4, 5, dim=3).eval()
    with torch.no_grad():
        model.user_bias.weight[1] = 0.5
        model.item_bias.weight[2] = -0.25
        model.user_factors.weight[1] = torch.tensor([1.0, 2.0, 0.0])
        model.item_factors.weight[2] = torch.tensor([0.5, 0.5, 9.0])
    out = model(torch.tensor([1]), torch.tensor([2]))
    assert torch.allclose(out, torch.tensor([3.5 + 0.5 - 0.25 + 1.5]))


def test_neural_cf_shapes_and_gradients() -> None:
    model = NeuralCF(6, 7)
    users, items = torch.tensor([0, 5]), torch.tensor([6, 1])
    out = model(users, items)
    assert out.shape == (2,)
    out.sum().backward()
    assert model.user_bias.weight.grad is not None
