"""The CIFAR ResNet-18: stem, blocks, parameter count, output shapes."""

from __future__ import annotations

import torch

from ringtrain.workloads.models import resnet18_cifar
from ringtrain.workloads.models.resnet import BasicBlock


def test_structure() -> None:
    model = resnet18_cifar()
    stem_conv = model.stem[0]
    assert stem_conv.kernel_size == (3, 3)
    assert stem_conv.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert sum(isinstance(m, BasicBlock) for m in model.modules()) == 8
    # the well-known size of ResNet-18 with a 3x3 stem and 10 classes
    assert sum(p.numel() for p in model.parameters()) == 11_173_962


def test_output_shapes() -> None:
    model = resnet18_cifar(num_classes=100).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 100)
        # global pooling: other sizes work too
        assert model(torch.randn(1, 3, 40, 24)).shape == (1, 100)


def test_grey_input() -> None:
    assert resnet18_cifar(in_channels=1).eval()(torch.randn(1, 1, 28, 28)).shape == (1, 10)
