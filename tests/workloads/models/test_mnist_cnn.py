"""The MNIST networks: shapes, outputs, the Horovod example's layer sizes."""

from __future__ import annotations

import torch

from ringtrain.workloads.models import HorovodMnistNet, MnistCNN


def test_horovod_net_layers_and_log_probabilities() -> None:
    torch.manual_seed(0)
    model = HorovodMnistNet()
    assert (model.conv1.out_channels, model.conv2.out_channels) == (10, 20)
    assert (model.fc1.in_features, model.fc1.out_features, model.fc2.out_features) == (320, 50, 10)
    assert isinstance(model.conv2_drop, torch.nn.Dropout2d)
    model.eval()
    out = model(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    assert torch.allclose(out.exp().sum(1), torch.ones(3), atol=1e-5)


def test_default_cnn_returns_logits() -> None:
    model = MnistCNN(num_classes=7)
    out = model(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 7)
    assert sum(p.numel() for p in model.parameters()) < 500_000  # small enough for quick CPU training


def test_dropout_only_in_training() -> None:
    model = MnistCNN().eval()
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(model(x), model(x))
