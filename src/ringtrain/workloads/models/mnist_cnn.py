"""Small convolutional networks for 28x28 grey images (MNIST, Fashion-MNIST)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class HorovodMnistNet(nn.Module):
    """The network of Horovod's PyTorch MNIST example, rebuilt: two 5x5 convolutions (10 and 20 maps,
    dropout on the second), a 50-unit hidden layer, 10 outputs as log-probabilities."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))  # 28 -> 24 -> 12
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))  # 12 -> 8 -> 4
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class MnistCNN(nn.Module):
    """The default ``mnist`` model: two padded 5x5 convolutions (32, 64 maps) with max-pooling,
    a 128-unit hidden layer with dropout; returns logits. Small enough for quick CPU training."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 28 -> 14
            nn.Conv2d(32, 64, kernel_size=5, padding=2), nn.ReLU(), nn.MaxPool2d(2),  # 14 -> 7
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
