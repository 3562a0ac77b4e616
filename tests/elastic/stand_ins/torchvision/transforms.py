"""``Compose``, ``ToTensor`` and ``Normalize`` on uint8 image tensors (what the stand-in MNIST yields)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


class Compose:
    def __init__(self, steps: Sequence[Callable[[torch.Tensor], torch.Tensor]]) -> None:
        self.steps = list(steps)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            image = step(image)
        return image


class ToTensor:
    """An HxW uint8 image to a 1xHxW float tensor in [0, 1], as torchvision does for a grey image."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.to(torch.float32).div(255.0).unsqueeze(0)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return (image - self.mean) / self.std
