"""ResNet-18 for 32x32 images: a 3x3 stem without max-pooling, then BasicBlocks [2, 2, 2, 2]."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: the stem keeps 32x32, four stages halve it three times, then global pooling."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 10, in_channels: int = 3,
                 width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        stages = []
        in_planes = width
        for i, count in enumerate(blocks):
            planes = width * 2**i
            for j in range(count):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet18_cifar(num_classes: int = 10, in_channels: int = 3) -> ResNet:
    """ResNet-18 for CIFAR (about 11.2 M parameters)."""
    return ResNet((2, 2, 2, 2), num_classes=num_classes, in_channels=in_channels)
