"""What the wrapping optimizers share: Horovod's checks of ``named_parameters`` and its messages, and the
wrapped class's step without torch's step hooks.

:mod:`ringtrain.optimizer` (gradients averaged before the step) and :mod:`ringtrain.adasum_optimizer`
(Horovod's delta optimizer for ``op=hvd.Adasum``) name parameters and refuse misuse the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times before call "
                    "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
                   "or optimizer.synchronize(). This is prohibited as it can cause a race condition.")
STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                    "your code.")


def unhooked_step(cls: type[torch.optim.Optimizer]) -> Any:
    """``cls.step`` without torch's wrapper that runs the optimizer's step hooks.

    torch wraps the ``step`` of every optimizer class it initialises, so that the hooks registered with
    ``register_step_pre_hook`` / ``register_step_post_hook`` run around it. A wrapper's own ``step``
    (wrapped too) that called the wrapped class's wrapped ``step`` would run every hook twice per step
    (an EMA of the weights kept in a post hook would move twice); calling this one runs them once.
    """
    step: Any = cls.step
    if getattr(step, "hooked", False):
        step = getattr(step, "__wrapped__", step)
    return step


def _duplicates(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dups: list[str] = []
    for name in names:
        if name in seen and name not in dups:
            dups.append(name)
        seen.add(name)
    return dups


def parameter_names(optimizer: torch.optim.Optimizer, named_parameters: Any,
                    backward_passes_per_step: int) -> dict[torch.Tensor, str]:
    """Each parameter's allreduce name, after Horovod's checks of ``named_parameters``."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(f"allreduce.noname.{i}.{j}", p)
                            for i, group in enumerate(optimizer.param_groups)
                            for j, p in enumerate(group["params"])]
    if any(not isinstance(item, tuple) for item in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                         "usually produced by model.named_parameters().")
    dups = _duplicates(name for name, _ in named_parameters)
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(dups))
    all_ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named_ids = {id(p) for _, p in named_parameters}
    unnamed = all_ids - named_ids
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not "
                         "named. Python object ids: " + ", ".join(str(i) for i in sorted(unnamed)))
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    return {p: name for name, p in sorted(named_parameters, key=lambda t: t[0])}
