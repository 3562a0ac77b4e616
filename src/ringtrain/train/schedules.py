"""Learning-rate scaling by world size and linear warm-up (Goyal et al., "Accurate, Large Minibatch SGD")."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def scale_learning_rate(optimizer: torch.optim.Optimizer, factor: float) -> None:
    """Multiply every parameter group's learning rate by ``factor`` (done once, before training)."""
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor


class LinearWarmup:
    """Multiplier ramping from ``1 / factor`` (the unscaled rate) to 1 over ``warmup_steps`` steps.

    A class rather than a closure, so that it stays picklable and its numbers are plain values.
    """

    def __init__(self, factor: float, warmup_steps: int) -> None:
        self.factor = factor
        self.warmup_steps = warmup_steps

    def __call__(self, step: int) -> float:
        if self.warmup_steps <= 0 or step >= self.warmup_steps:
            return 1.0
        start = 1.0 / self.factor
        return start + (1.0 - start) * step / self.warmup_steps


def warmup_scheduler(optimizer: torch.optim.Optimizer, factor: float, warmup_steps: int) -> LambdaLR:
    """A per-step scheduler applying ``LinearWarmup`` to the (already scaled) learning rates."""
    return LambdaLR(optimizer, LinearWarmup(factor, warmup_steps))
