"""Metrics that stay correct across ranks: sums of ``value x count`` and of counts, all-reduced.

A mean of per-rank means is wrong whenever shards differ in size (a dataset not divisible by the
number of ranks); and ``DistributedSampler`` pads the last shards with repeated items. So every rank
adds up totals over its *real* items only, one allreduce sums them, and the division happens last.

The running sums stay tensors on the model's device until they are read: converting every batch's
loss to a Python float would make the host wait for the device each step (a CUDA sync), which keeps
it from queueing the next step's work while this one computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

SumFn = Callable[[torch.Tensor], torch.Tensor]
"""Sums a float64 tensor over all ranks and returns the result (the strategy's allreduce)."""


def real_items_in_batch(dataset_size: int, world_size: int, rank: int, batch_size: int, batch: int) -> int:
    """How many items of batch number ``batch`` on ``rank`` are real, not ``DistributedSampler`` padding.

    The padded sampler hands rank ``r`` the positions ``r, r + W, r + 2W, ...`` of a list whose
    positions ``>= dataset_size`` repeat earlier items, so padding only ever ends a rank's last batch.
    """
    per_rank = math.ceil(dataset_size / world_size)
    start = batch * batch_size
    stop = min(start + batch_size, per_rank)
    # positions rank + W*j for j in [start, stop) that fall inside the dataset
    real = sum(1 for j in range(start, stop) if rank + world_size * j < dataset_size)
    return real


@dataclass
class MetricTotals:
    """Running totals on one rank: summed loss, correct predictions, squared error, items."""

    loss_sum: float = 0.0
    correct: float = 0.0
    squared_error: float = 0.0
    count: float = 0.0
    _pending: torch.Tensor | None = field(default=None, repr=False, compare=False)
    """Sums of loss x items, correct and squared error added since the last ``flush``, on the device."""

    def add(self, loss: torch.Tensor, outputs: torch.Tensor, targets: torch.Tensor, task: str) -> None:
        """Add one batch (already cut to its real items); ``loss`` is the batch's mean loss."""
        n = int(targets.shape[0])
        if n == 0:
            return
        self.count += n
        with torch.no_grad():
            if self._pending is None:
                self._pending = torch.zeros(3, dtype=torch.float64, device=loss.device)
            self._pending[0] += loss.detach().double() * n
            if task == "classification":
                self._pending[1] += (outputs.detach().argmax(dim=-1) == targets).sum()
            else:
                diff = outputs.detach().float().reshape(targets.shape) - targets.float()
                self._pending[2] += (diff * diff).sum()

    def flush(self) -> MetricTotals:
        """Move the device-side sums into the float fields (one host-device sync); returns self."""
        if self._pending is not None:
            loss_sum, correct, squared_error = self._pending.tolist()
            self.loss_sum += loss_sum
            self.correct += correct
            self.squared_error += squared_error
            self._pending = None
        return self

    def reduce(self, sum_fn: SumFn | None) -> MetricTotals:
        """The totals over all ranks (``sum_fn`` None: this rank alone)."""
        self.flush()
        values = torch.tensor([self.loss_sum, self.correct, self.squared_error, self.count],
                              dtype=torch.float64)
        if sum_fn is not None:
            values = sum_fn(values)
        return MetricTotals.of(values)

    @classmethod
    def of(cls, values: Iterable[Any]) -> MetricTotals:
        """Totals from the four values ``(loss_sum, correct, squared_error, count)`` (a snapshot's row)."""
        loss_sum, correct, squared_error, count = (float(v) for v in values)
        return cls(loss_sum, correct, squared_error, count)

    @property
    def loss(self) -> float:
        """Mean loss per item (nan with no items)."""
        self.flush()
        return self.loss_sum / self.count if self.count else float("nan")

    @property
    def accuracy(self) -> float:
        """Fraction of items classified right (nan with no items)."""
        self.flush()
        return self.correct / self.count if self.count else float("nan")

    @property
    def rmse(self) -> float:
        """Root mean squared error of regression outputs (nan with no items)."""
        self.flush()
        return math.sqrt(self.squared_error / self.count) if self.count else float("nan")


@dataclass(frozen=True)
class EpochResult:
    """What one epoch produced, as every rank agrees on it."""

    epoch: int
    """1-based epoch number."""
    seconds: float
    """Wall time of the training part of the epoch (evaluation excluded)."""
    train_loss: float
    """Mean training loss per real item, over all ranks."""
    samples_per_second: float
    """Real training items of all ranks per second of training."""
    steps: int
    """Optimizer steps taken so far in the whole run."""
    eval_loss: float = float("nan")
    accuracy: float = float("nan")
    rmse: float = float("nan")
    eval_items: int = 0
    """Items evaluated over all ranks (each once: padding is not counted)."""
    snapshot: str | None = None
    """Path of the snapshot written at the end of this epoch, if any."""

    def summary(self, epochs: int, task: str) -> str:
        """One line for the console."""
        parts = [f"epoch {self.epoch}/{epochs}", f"time {self.seconds:.1f}s",
                 f"train loss {self.train_loss:.4f}"]
        if self.eval_items:
            parts.append(f"eval loss {self.eval_loss:.4f}")
            if task == "classification":
                parts.append(f"accuracy {100 * self.accuracy:.2f}%")
            else:
                parts.append(f"RMSE {self.rmse:.4f}")
        parts.append(f"{self.samples_per_second:.0f} samples/s")
        if self.snapshot:
            parts.append(f"snapshot {self.snapshot}")
        return "  ".join(parts)

    def as_row(self) -> dict[str, float | int | str]:
        """The values for a CSV row."""
        return {"epoch": self.epoch, "seconds": round(self.seconds, 4), "train_loss": self.train_loss,
                "eval_loss": self.eval_loss, "accuracy": self.accuracy, "rmse": self.rmse,
                "samples_per_second": round(self.samples_per_second, 2), "steps": self.steps,
                "snapshot": self.snapshot or ""}
