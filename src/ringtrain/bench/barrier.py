"""The ``barrier`` reference of ``ringtrain bench``: synchronous steps without gradient exchange.

Every rank trains its own copy of the model on its shard (as the ``independent`` copies do) but, where
a data-parallel strategy would average the gradients, it joins a 4-byte allreduce instead, so that no
rank starts step ``k + 1`` before every rank finished step ``k``'s backward pass. What that costs
against the independent copies is the price of running in lockstep on this machine: the wait for the
slowest rank of every step (the step-to-step jitter of a shared or virtual machine), and whatever the
ranks lose by doing the same phase of the step at the same moment (shared caches and memory bandwidth).
No synchronous strategy can beat it: Horovod's and DDP's distance to it is what their gradient
exchange costs.

It is a measurement device, not a way to train: the replicas drift apart from the first step.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ringtrain.train.strategies import HorovodStrategy, step_optimizer

#: Name of the per-step allreduce (one name: the engine's response cache serves it from the 2nd step).
BARRIER_NAME = "ringtrain.bench.barrier"


class BarrierStrategy(HorovodStrategy):
    """Horovod's set-up and collectives, a plain optimizer, one tiny allreduce per optimizer step."""

    name = "barrier"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = torch.zeros(1)
        #: Optimizer steps that waited for every rank (tests read it).
        self.barriers = 0

    def prepare(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
        from ringtrain.functions import broadcast_parameters

        # the same start as the other strategies' (one seed on every rank makes it so already)
        broadcast_parameters(model.state_dict(), root_rank=0)
        return model, optimizer

    def step(self, optimizer: Any, scaler: torch.amp.GradScaler | None) -> None:
        assert self._hvd is not None, "setup() first"
        self._hvd.allreduce_(self._token, name=BARRIER_NAME, op=self._hvd.Sum)
        self.barriers += 1
        step_optimizer(optimizer, scaler)
