"""The small CNN of the synthetic workload accepts any channel count and image size."""

from __future__ import annotations

import pytest
import torch

from ringtrain.workloads.models import SmallConvNet


@pytest.mark.parametrize(("channels", "size"), [(1, 28), (3, 32), (4, 1), (2, 7)])
def test_any_size(channels: int, size: int) -> None:
    model = SmallConvNet(in_channels=channels, num_classes=5)
    assert model(torch.randn(2, channels, size, size)).shape == (2, 5)
