"""The DDP strategy's comm hooks: torch's PowerSGD, with its state kept in snapshots, and bfloat16.

torch keeps the hook's state per DDP bucket (``PowerSGDState``: the error feedback, P and Q of each
bucket as flat tensors, keyed by the bucket's index, the iteration and the generator that seeds Q).
A bucket's layout is DDP's and changes: DDP lays its buckets out in the parameters' order, then
rebuilds them after the first iteration in the order the gradients became ready, and a resumed
process starts again from the parameters' order. torch's hook assumes the layout never changes once
compression has started (its ``start_powerSGD_iter`` must be at least 2 for that reason), which holds
in one process but not across a resume. So this wrapper remembers the names of each bucket's
parameters and, when a bucket comes with the same parameters in another order, moves its error
feedback, P and Q to the new order before torch's hook reads them (:class:`BucketLayout`); the state is
saved with those names. Only a bucket whose parameters differ from the saved one's starts its error
feedback and Q afresh (said once in the log): a step of lesser accuracy, never a wrong update.
"""

# No ``from __future__ import annotations`` here: torch checks that a comm hook's ``bucket`` parameter is
# annotated with the class dist.GradBucket itself (or not at all), and a postponed annotation is a string.
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ringtrain.train.logs import LOGGER_NAME

#: PowerSGD's plain allreduces before compression starts (torch needs more than 1 with error feedback).
DEFAULT_START_ITER = 10


class DDPPowerSGD:
    """Registers torch's ``powerSGD_hook`` on ``ddp_model`` and saves and restores its state."""

    def __init__(self, ddp_model: nn.Module, process_group: Any, rank: int,
                 start_iter: int = DEFAULT_START_ITER, seed: int = 0) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        self._hook_fn = powerSGD_hook.powerSGD_hook
        self.state = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=rank,
            start_powerSGD_iter=max(2, start_iter), min_compression_rate=2, use_error_feedback=True,
            warm_start=True, random_seed=seed)
        module = getattr(ddp_model, "module", ddp_model)
        self._names = {id(p): name for name, p in module.named_parameters()}
        self._shapes = {name: tuple(p.shape) for name, p in module.named_parameters()}
        #: The parameter names of each bucket the hook has seen, by bucket index.
        self._layout: dict[int, list[str]] = {}
        #: Saved buckets waiting for the hook's first look at a bucket of that index.
        self._pending: dict[int, dict[str, Any]] = {}
        self._told = False
        #: The future of the bucket the hook handled last (see _hook).
        self._previous: torch.futures.Future[torch.Tensor] | None = None
        ddp_model.register_comm_hook(self.state, self._hook)  # type: ignore[operator]

    def _hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        index = bucket.index()
        names = [self._names.get(id(p), "?") for p in bucket.parameters()]
        saved = self._pending.pop(index, None)
        if saved is not None:
            self._install(index, saved, names, bucket.buffer().device)
        else:
            before = self._layout.get(index)
            if before is not None and before != names:  # DDP rebuilt its buckets: move the state along
                held = {key: memory.pop(index) for key, memory in self._memories() if index in memory}
                if held:
                    self._install(index, {"params": before, **held}, names, bucket.buffer().device)
        self._layout[index] = names
        # torch's hook issues a bucket's second and third allreduce from the callbacks of its first: with
        # two buckets in flight their callbacks race, and ranks on which they complete in another order
        # issue the buckets' P allreduces in another order (on gloo: "Received data size doesn't match
        # expected size"). One bucket's chain at a time keeps the collectives in one order everywhere.
        if self._previous is not None and not self._previous.done():
            self._previous.wait()
        future = self._hook_fn(state, bucket)
        self._previous = future
        return future

    def _memories(self) -> tuple[tuple[str, dict[int, torch.Tensor]], ...]:
        s = self.state
        return (("error", s.error_dict), ("p", s.p_memory_dict), ("q", s.q_memory_dict))

    def _install(self, index: int, held: Mapping[str, Any], names: list[str], device: torch.device) -> None:
        """Put bucket ``index``'s state ``held`` (laid out for ``held["params"]``) in place for ``names``."""
        if sorted(held["params"]) != sorted(names):
            if not self._told:
                self._told = True
                logging.getLogger(LOGGER_NAME).warning(
                    "PowerSGD (ddp): gradient bucket %d holds other parameters than in the snapshot, so its "
                    "error feedback and Q start afresh", index)
            return
        rank = self.state.matrix_approximation_rank
        rate = self.state.min_compression_rate
        old = BucketLayout(held["params"], self._shapes, rank, rate)
        new = BucketLayout(names, self._shapes, rank, rate)
        for key, memory in self._memories():
            if held.get(key) is not None:
                memory[index] = old.moved(key, held[key].to(device), new)

    def state_dict(self) -> dict[str, Any]:
        """The hook's state of this rank: tensors and plain values only (``weights_only`` loads it)."""
        import numpy as np

        s = self.state
        name, keys, position, has_gauss, gauss = s.rng.get_state()
        buckets = {}
        for index in sorted(set(s.error_dict) | set(s.q_memory_dict) | set(self._pending)):
            if index in self._pending:  # restored, not yet used: keep it as it came
                buckets[str(index)] = self._pending[index]
                continue
            buckets[str(index)] = {
                "params": list(self._layout.get(index, [])),
                "error": _cpu(s.error_dict.get(index)), "p": _cpu(s.p_memory_dict.get(index)),
                "q": _cpu(s.q_memory_dict.get(index))}
        return {"iter": int(s.iter), "rank": int(s.matrix_approximation_rank),
                "rng": {"name": str(name), "keys": torch.from_numpy(np.asarray(keys).astype("int64")),
                        "pos": int(position), "has_gauss": int(has_gauss), "gauss": float(gauss)},
                "buckets": buckets}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` (this rank's, or :func:`merge` of another world's)."""
        import numpy as np

        s = self.state
        s.iter = int(saved["iter"])
        rng = saved["rng"]
        s.rng.set_state((rng["name"], rng["keys"].numpy().astype(np.uint32), int(rng["pos"]),
                         int(rng["has_gauss"]), float(rng["gauss"])))
        s.error_dict.clear()
        s.p_memory_dict.clear()
        s.q_memory_dict.clear()
        same_rank = int(saved.get("rank", s.matrix_approximation_rank)) == s.matrix_approximation_rank
        # P and Q of another rank do not fit this one's buckets: only the error feedback carries over
        self._pending = {int(index): dict(bucket) if same_rank else {**bucket, "p": None, "q": None}
                         for index, bucket in saved.get("buckets", {}).items()}


class BucketLayout:
    """Where each parameter's share of a bucket's error feedback, P and Q lies in torch's flat tensors.

    The error feedback follows the bucket: each parameter's gradient in turn. P and Q hold the factors
    of the gradients torch compresses (a gradient of shape ``(n, ...)`` seen as an ``n x m`` matrix, at
    rank ``min(n, m, R)``, when its factors are ``rate`` times smaller than it), grouped by matrix shape
    in the order each shape first appears, each group in bucket order: ``n x r`` for P, ``m x r`` for Q.
    """

    def __init__(self, names: list[str], shapes: Mapping[str, tuple[int, ...]], rank: int,
                 rate: float) -> None:
        self.slices: dict[str, dict[str, slice]] = {"error": {}, "p": {}, "q": {}}
        start = 0
        groups: dict[tuple[int, int], list[tuple[str, int]]] = {}
        for name in names:
            shape = shapes[name]
            numel = 1
            for dim in shape:
                numel *= int(dim)
            self.slices["error"][name] = slice(start, start + numel)
            start += numel
            n = int(shape[0]) if shape else 1
            m = numel // n if n else 0
            r = min(n, m, rank)
            if (n + m) * r * rate < n * m:
                groups.setdefault((n, m), []).append((name, r))
        p_at = q_at = 0
        for (n, m), members in groups.items():
            for name, r in members:
                self.slices["p"][name] = slice(p_at, p_at + n * r)
                self.slices["q"][name] = slice(q_at, q_at + m * r)
                p_at, q_at = p_at + n * r, q_at + m * r

    def moved(self, key: str, flat: torch.Tensor, new: "BucketLayout") -> torch.Tensor:
        """``flat`` (this layout's ``key`` tensor) in the order of layout ``new``."""
        out = torch.empty_like(flat)
        for name, there in self.slices[key].items():
            out[new.slices[key][name]] = flat[there]
        return out


def merge(states: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Every rank's saved hook state as one state for a world of another size: the error feedback
    averaged over the ranks (what the ranks still owe the model, in total, is kept), the rest from the
    first rank (P, Q, the iteration and the generator are the same on every rank)."""
    first = dict(states[0])
    buckets = {}
    for index, bucket in first.get("buckets", {}).items():
        errors = [s["buckets"][index]["error"] for s in states
                  if index in s.get("buckets", {}) and s["buckets"][index].get("error") is not None
                  and s["buckets"][index]["params"] == bucket["params"]]
        merged = dict(bucket)
        if errors and len(errors) == len(states):
            merged["error"] = torch.stack(errors).mean(dim=0)
        else:
            merged["error"] = None
        buckets[index] = merged
    first["buckets"] = buckets
    return first


def bf16_hook(process_group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP comm hook that averages a bucket as bfloat16 on any backend (torch's refuses all but NCCL)."""
    group = process_group if process_group is not None else dist.group.WORLD
    size = dist.get_world_size(group)
    wire = bucket.buffer().to(torch.bfloat16).div_(size)
    reduced = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def back(future: torch.futures.Future[Any]) -> torch.Tensor:
        buffer = bucket.buffer()
        buffer.copy_(future.value()[0])
        return buffer

    return reduced.then(back)


def _cpu(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().to("cpu", copy=True)


__all__ = ["DEFAULT_START_ITER", "BucketLayout", "DDPPowerSGD", "bf16_hook", "merge"]
