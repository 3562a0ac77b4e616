"""A small CNN for images of any channel count and size (the synthetic workload's default)."""

from __future__ import annotations

import torch
from torch import nn


class SmallConvNet(nn.Module):
    """Two 3x3 convolutions (the second with stride 2), adaptive pooling to 4x4, two linear layers.

    The adaptive pooling makes it accept any image size, down to 1x1.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(),
                                        nn.Linear(128, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
