"""Sharded optimizer state (ZeRO stage 1) for ``DistributedOptimizer(..., shard_optimizer_state=True)``.

Data parallelism gives every rank the same optimizer state: with Adam, two tensors the size of each
parameter, held ``n`` times over for nothing. Here every trainable parameter is **owned** by one rank
of the optimizer's process set, and the wrapped optimizer's state exists only on the owner.

**Ownership** (:func:`assign_owners`): parameters by element count, largest first, each to the rank
that owns the fewest elements so far (ties: the lower rank; equal sizes: by name). It depends only on
the names, the sizes and the number of ranks, so every rank computes the same table without talking,
and a snapshot's owners can be recomputed offline. A parameter is never split: a model whose largest
tensor is more than ``1/n`` of it is as balanced as that tensor allows.

**A step.**

1. Gradients take the unsharded path unchanged: bucketed grouped allreduces sent from the gradient
   hooks during backward (fp16/bf16 casts, PowerSGD, ``backward_passes_per_step``, ``op``,
   ``gradient_predivide_factor`` and ``process_set`` as without sharding).
2. ``step()`` runs the wrapped optimizer with the gradients of parameters owned elsewhere hidden
   (``p.grad`` is None for that call and put back after), so torch's optimizers update and create
   state for the owned parameters only; state that an optimizer creates eagerly for every parameter
   (Adagrad's) is dropped for the others.
3. Each bucket's parameters are then made whole again by a ``Sum`` allreduce, in place, to which
   every rank contributes its owned parameters and zeros for the rest: an allgather in effect. Each
   element is ``x + 0 + ... + 0 = x``, so every rank ends with the owner's bits (only a ``-0.0``
   comes back as ``+0.0``), on the same engine paths as the gradients.

**Why allreduce, not reduce-scatter, for the gradients.** Every rank then holds the whole averaged
gradient, as without sharding, which is what makes the rest work unchanged: a GradScaler finds the
same inf/NaN on every rank (so every rank steps, or every rank skips, and none waits in an exchange
the others skipped); ``clip_grad_norm_`` computes the global norm with no extra collective; PowerSGD
and the 16-bit casts need no sharded variant. It costs no more bytes than unsharded data parallelism
(a ring allreduce is a reduce-scatter followed by an allgather), and the engine's reducescatter is
itself an allreduce followed by a slice (``engine/executor.run_reducescatter``), so reduce-scatter
would have saved nothing on the wire while leaving every rank without the gradients it does not own.
torch's ``ZeroRedundancyOptimizer`` makes the same choice (DDP's allreduce, then broadcasts).

**Why an allreduce of zeros and owned values for the parameters.** The engine's allgather and
broadcast run on gloo one tensor at a time, while its allreduce fuses a bucket and takes the fast
paths: shared memory among the ranks of one host (each rank reduces its chunk of every segment, then
copies the others') and the socket ring across hosts. The exchange writes into the parameters
themselves (no buffer beyond the engine's fusion buffer, which the gradients use already). The price
is bytes: across hosts the ring moves ``2 (n-1)/n`` of the parameters per rank against ``(n-1)/n``
for an allgather; within one host both are memory copies of the same order.

**Memory.** Optimizer state: the owned parameters' only (about ``1/n``). Gradients and parameters:
whole on every rank, as ZeRO stage 1 keeps them.

What it saves and costs, measured against torch's ``ZeroRedundancyOptimizer``: benchmarks/README.md
(``shard_bench.py``).

**State dicts.** ``state_dict()`` is this rank's shard: torch's layout with an empty ``"state"``, plus
``"ringtrain_sharded"``: ``world`` (the set's size), ``rank``, ``owners`` (every trainable parameter's
name -> its owner), ``params`` (every parameter's name in the optimizer's index order) and ``state``
(this rank's entries keyed by name). ``load_state_dict`` takes this rank's own shard, a list of every
rank's shards from a world of any size (each rank keeps what it now owns: how a sharded snapshot
resumes at another number of ranks), or an unsharded state dict (each rank keeps what it owns).
:func:`consolidate` turns a list of shards into the state dict an unsharded ``DistributedOptimizer``
saves, and :func:`split` turns that back into shards.

**broadcast_optimizer_state** (``hvd.broadcast_optimizer_state(opt, root_rank)``): per-parameter
state stays with its owner (the root has only its own). What it does instead, collectively: it
re-shards (each parameter's state goes to its current owner from whichever rank holds it), creates
the state by a zero-gradient step where no rank has any (as the unsharded optimizer does, so sharded
and unsharded runs stay identical), and broadcasts the hyperparameters of the parameter groups from
the root.

**Elastic training.** ``hvd.elastic.TorchState`` keeps each rank's shard at every commit (its deep
copy of ``state_dict()``). After a failure each survivor restores its own shard; in the new world the
first ``broadcast_optimizer_state`` (``TorchState.sync``), or else the first step in the new engine,
re-shards: new owners receive the state of the parameters they now own from the ranks that hold it.
The state of a parameter whose holder left the job is lost: it starts afresh on its new owner (Adam
from step 0 for that tensor), with a warning naming how many. Keeping a second copy on another rank
would avoid that at the cost of a second shard of memory; it is not done.
"""

from __future__ import annotations

import copy
import heapq
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ringtrain import mpi_ops
from ringtrain.engine import state as engine_state
from ringtrain.functions import _initialize_state, allgather_object, broadcast_object
from ringtrain.optimizer_names import unhooked_step
from ringtrain.powersgd import STATE_KEY as POWERSGD_KEY
from ringtrain.powersgd import merge_powersgd_states

log = logging.getLogger("ringtrain.sharding")

#: The key of a sharded optimizer's state dict that holds its shard and the index of owners.
KEY = "ringtrain_sharded"

_NOT_PER_PARAMETER = (
    "shard_optimizer_state=True cannot shard {name}: its state (the curvature history of the last "
    "steps) belongs to all parameters together, not to each parameter, so no rank can own a part of it. "
    "HINT: use shard_optimizer_state=False with {name}, or an optimizer whose state is per parameter "
    "(SGD, Adam, AdamW, Adagrad, RMSprop, Adafactor, ...).")
_ADASUM = (
    "shard_optimizer_state=True cannot be used with op=hvd.Adasum: Adasum combines the updates of every "
    "rank's own optimizer step, so every rank needs the whole optimizer state. HINT: use op=hvd.Average "
    "(or hvd.Sum) with shard_optimizer_state=True, or shard_optimizer_state=False with Adasum.")
_SPARSE = (
    "{name}: a sparse gradient (nn.Embedding(sparse=True) or the like) cannot be used with "
    "shard_optimizer_state=True: the parameters are exchanged dense after each step. HINT: pass "
    "sparse_as_dense=True to DistributedOptimizer, or use shard_optimizer_state=False.")


def check_request(optimizer: torch.optim.Optimizer, op: int) -> None:
    """Refuse what cannot be sharded (raises ValueError with a HINT; the same on every rank)."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(_NOT_PER_PARAMETER.format(name=f"torch.optim.{type(optimizer).__name__}"
                                                   if type(optimizer) is torch.optim.LBFGS
                                                   else type(optimizer).__name__))
    if op == mpi_ops.Adasum:
        raise ValueError(_ADASUM)


def sparse_gradient_error(name: str | None) -> ValueError:
    """The error a sharded optimizer's gradient hook raises for a sparse gradient."""
    return ValueError(_SPARSE.format(name=name))


# --- ownership -----------------------------------------------------------------------------------

def assign_owners(sizes: Iterable[tuple[str, int]], world_size: int) -> dict[str, int]:
    """Each parameter name -> the rank that owns it, balanced by element count.

    ``sizes``: ``(name, number of elements)`` of every trainable parameter. Largest first, each goes to
    the rank with the fewest elements so far (the lower rank on a tie; equal sizes in name order): the
    most loaded rank is within 4/3 of the best possible split. Deterministic: the same on every rank,
    and offline.
    """
    if world_size < 1:
        raise ValueError(f"assign_owners: world_size must be at least 1, got {world_size}.")
    loads = [(0, rank) for rank in range(world_size)]
    owners: dict[str, int] = {}
    for name, numel in sorted(sizes, key=lambda item: (-item[1], item[0])):
        load, rank = heapq.heappop(loads)
        owners[name] = rank
        heapq.heappush(loads, (load + numel, rank))
    return dict(sorted(owners.items()))


def plan_moves(held: Sequence[Iterable[str]], owners: Mapping[str, int]
               ) -> tuple[dict[int, dict[str, int]], list[str]]:
    """What a re-shard sends: ``({sender: {name: receiver}}, lost names)``.

    ``held[r]``: the names whose state rank ``r`` holds. A parameter's owner keeps its own copy if it
    has one; else the lowest rank that holds it sends it. Names that no rank holds are ``lost`` (they
    start afresh); names that no longer have an owner are dropped.
    """
    holders: dict[str, list[int]] = {}
    for rank, names in enumerate(held):
        for name in names:
            holders.setdefault(name, []).append(rank)
    moves: dict[int, dict[str, int]] = {}
    lost: list[str] = []
    for name, owner in sorted(owners.items()):
        who = holders.get(name)
        if not who:
            lost.append(name)
        elif owner not in who:
            moves.setdefault(min(who), {})[name] = owner
    return moves, lost


# --- state dicts ---------------------------------------------------------------------------------

def is_shard(state_dict: Any) -> bool:
    """Whether ``state_dict`` is one rank's shard (a sharded optimizer's ``state_dict()``)."""
    return isinstance(state_dict, Mapping) and KEY in state_dict


def _check_world(shards: Sequence[Any]) -> list[Mapping[str, Any]]:
    """The shards of one whole world in rank order, or a ValueError that says what is missing."""
    if not shards:
        raise ValueError("no shards given. HINT: pass the state_dict() of every rank of the sharded run, "
                         "one per rank.")
    bad = [i for i, s in enumerate(shards) if not is_shard(s)]
    if bad:
        raise ValueError(f"entries {bad} of the list are not shards of a sharded optimizer (they have no "
                         f"{KEY!r} entry). HINT: pass the state_dict() of every rank of a run with "
                         "shard_optimizer_state=True, or one unsharded state dict (not in a list).")
    worlds = sorted({int(s[KEY]["world"]) for s in shards})
    ranks = sorted(int(s[KEY]["rank"]) for s in shards)
    if len(worlds) != 1 or ranks != list(range(worlds[0])):
        raise ValueError(f"got the shards of ranks {ranks} of worlds of size {worlds}; the shards of every "
                         "rank of one world are needed. HINT: save optimizer.state_dict() on every rank at "
                         "the same step and pass them all, in any order.")
    ordered = sorted(shards, key=lambda s: int(s[KEY]["rank"]))
    params = ordered[0][KEY]["params"]
    if any(s[KEY]["params"] != params for s in ordered):
        raise ValueError("the shards name different parameters: they come from different models or "
                         "optimizers. HINT: pass the shards of one run, saved at the same step.")
    return ordered


def _entries_of(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every parameter's state entry from a whole world's shards (the owner's where several hold one)."""
    entries: dict[str, Any] = {}
    for shard in shards:
        info = shard[KEY]
        for name, entry in info["state"].items():
            if name not in entries or info["owners"].get(name) == info["rank"]:
                entries[name] = entry
    return entries


def _powersgd_of(shards: Sequence[Mapping[str, Any]]) -> Any:
    """PowerSGD's entry for a resume at another world: every rank's merged (None if the run had none)."""
    entries = [s[POWERSGD_KEY] for s in shards if POWERSGD_KEY in s]
    if len(entries) != len(shards):
        return None
    return merge_powersgd_states(entries)


def consolidate(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The state dict an unsharded ``DistributedOptimizer`` would have saved, from every rank's shard.

    ``shards``: ``optimizer.state_dict()`` of every rank of a sharded run (any order). The result is
    torch's layout: ``"state"`` by parameter index, ``"param_groups"`` (rank 0's; every rank has the
    same), and with PowerSGD its entry merged over the ranks (``merge_powersgd_states``). Tensors are
    the shards' own (not copies), as ``state_dict()`` gives them.
    """
    ordered = _check_world(shards)
    params = list(ordered[0][KEY]["params"])
    position = {name: index for index, name in enumerate(params)}
    entries = _entries_of(ordered)
    unknown = sorted(set(entries) - set(position))
    if unknown:
        raise ValueError(f"the shards hold state for parameters their index does not name: {unknown[:5]}. "
                         "HINT: pass shards saved by ringtrain's sharded optimizer, unchanged.")
    result: dict[str, Any] = {
        "state": {position[name]: entries[name] for name in sorted(entries, key=position.__getitem__)},
        "param_groups": ordered[0]["param_groups"],
    }
    powersgd = _powersgd_of(ordered)
    if powersgd is not None:
        result[POWERSGD_KEY] = powersgd
    return result


def split(state_dict: Mapping[str, Any], parameters: Any, world_size: int) -> list[dict[str, Any]]:
    """The reverse of :func:`consolidate`: an unsharded state dict cut into the shards of ``world_size``
    ranks, as a sharded run of that size would have saved them (rank order).

    ``parameters``: the optimizer the state dict belongs to (a ``DistributedOptimizer``, which knows
    its parameter names), or ``(name, parameter)`` pairs in the optimizer's parameter order (for
    ``Adam(model.parameters())`` that is ``model.named_parameters()``). Parameters that do not require
    gradients have no owner. Tensors are the state dict's own (not copies).
    """
    names, sizes = _layout(parameters)
    groups = state_dict["param_groups"]
    if sum(len(g["params"]) for g in groups) != len(names):
        raise ValueError(f"the state dict has {sum(len(g['params']) for g in groups)} parameters, "
                         f"{len(names)} were named. HINT: pass the parameters in the optimizer's order.")
    owners = assign_owners(sizes, world_size)
    shards = []
    for rank in range(world_size):
        mine = {names[int(index)]: entry for index, entry in state_dict["state"].items()
                if owners.get(names[int(index)]) == rank}
        shard: dict[str, Any] = {"state": {}, "param_groups": groups,
                                 KEY: {"world": world_size, "rank": rank, "owners": dict(owners),
                                       "params": list(names), "state": mine}}
        if POWERSGD_KEY in state_dict:
            shard[POWERSGD_KEY] = state_dict[POWERSGD_KEY]
        shards.append(shard)
    return shards


def _layout(parameters: Any) -> tuple[list[str], list[tuple[str, int]]]:
    """(every parameter's name in index order, (name, numel) of the trainable ones)."""
    named = getattr(parameters, "_parameter_names", None)
    if named is not None and hasattr(parameters, "param_groups"):
        pairs = [(named[p], p) for group in parameters.param_groups for p in group["params"]]
    else:
        pairs = list(parameters)
    if any(not isinstance(pair, tuple) or len(pair) != 2 for pair in pairs):
        raise ValueError("parameters: pass the DistributedOptimizer, or (name, parameter) pairs such as "
                         "model.named_parameters(). HINT: split(state_dict, model.named_parameters(), n).")
    names = [name for name, _ in pairs]
    sizes = [(name, p.numel()) for name, p in pairs if p.requires_grad]
    return names, sizes


def unsharded(state: Any) -> dict[str, Any]:
    """What an unsharded optimizer loads from a list of every rank's shards (consolidated); a lone shard
    of a world of more than one rank is refused (it has only that rank's part)."""
    if isinstance(state, list | tuple):
        return consolidate(state)
    info = state[KEY]
    if int(info["world"]) == 1:
        return consolidate([state])
    raise ValueError(f"this is the shard of rank {info['rank']} of {info['world']} of a sharded optimizer: "
                     "it holds that rank's part of the state only. HINT: load the list of every rank's "
                     "state_dict(), or ringtrain.sharding.consolidate(shards), into an unsharded "
                     "optimizer; or pass shard_optimizer_state=True to DistributedOptimizer.")


def _to_cpu(value: Any) -> Any:
    """A state entry with its tensors on the CPU (to travel as a pickle; loading casts them back)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


# --- the report ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardingReport:
    """What ``optimizer.sharding_report()`` returns: this rank's part of the optimizer state.

    ``owned``: the names of the parameters this rank owns; ``state_bytes``: this rank's optimizer
    state; ``state_bytes_by_rank``: every rank's, in set order (their sum is what each rank would hold
    unsharded). Unsharded, a rank owns every parameter.
    """

    sharded: bool
    rank: int
    world_size: int
    owned: tuple[str, ...]
    parameters: int
    owned_elements: int
    total_elements: int
    state_bytes: int
    state_bytes_by_rank: tuple[int, ...]

    @property
    def unsharded_state_bytes(self) -> int:
        """The optimizer state one rank would hold without sharding."""
        return sum(self.state_bytes_by_rank)

    @property
    def state_fraction(self) -> float:
        """This rank's state over the unsharded state (1.0 without state yet)."""
        total = self.unsharded_state_bytes
        return self.state_bytes / total if total else 1.0

    def __str__(self) -> str:
        if not self.sharded:
            return f"optimizer state not sharded: {_mb(self.state_bytes)} on every rank"
        return (f"optimizer state sharded over {self.world_size} ranks: rank {self.rank} owns "
                f"{len(self.owned)} of {self.parameters} parameters ({_count(self.owned_elements)} of "
                f"{_count(self.total_elements)} elements) and holds {_mb(self.state_bytes)} of optimizer "
                f"state, {self.state_fraction:.2f}x the {_mb(self.unsharded_state_bytes)} unsharded")


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _count(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 10**5 else str(n)


# --- the optimizer's side ------------------------------------------------------------------------

class Sharding:
    """The sharded side of one ``DistributedOptimizer`` (``optimizer._ringtrain_sharding``).

    ``optimizer`` is the dynamic subclass of :mod:`ringtrain.optimizer`; this reads its parameter
    names, buckets and process set, and calls the wrapped class's ``step``, ``state_dict`` and
    ``load_state_dict`` (``optimizer._ringtrain_base``).
    """

    def __init__(self, optimizer: Any, communicate: bool, elastic: bool) -> None:
        self._opt = optimizer
        self._base: type[torch.optim.Optimizer] = optimizer._ringtrain_base
        names: dict[torch.Tensor, str] = optimizer._parameter_names
        self._names = names
        params = [p for group in optimizer.param_groups for p in group["params"]]
        #: every parameter's name, in the optimizer's index order (its state dicts' numbering)
        self.index_names = [names[p] for p in params]
        self._position = {name: index for index, name in enumerate(self.index_names)}
        self._by_name = {names[p]: p for p in params}
        self._trainable = [p for p in params if p.requires_grad]
        self._sizes = [(names[p], p.numel()) for p in self._trainable]
        self._communicate = communicate
        self._elastic = elastic
        self._engine: weakref.ref[Any] | None = None
        self.rank, self.world_size = 0, 1
        self.owners: dict[str, int] = {}
        self._owned: set[torch.Tensor] = set()
        self._foreign: list[torch.Tensor] = []
        self._assign()
        self._drop_foreign_state()  # Adagrad creates its state in __init__, for every parameter
        if communicate and not elastic:
            self._engine = weakref.ref(engine_state.require())

    # --- ownership ---------------------------------------------------------------------------

    def _world(self) -> tuple[int, int]:
        if not self._communicate:
            return 0, 1
        process_set = self._opt.process_set
        rank, size = process_set.rank(), process_set.size()
        assert rank is not None, "a member of a registered set"
        assert size is not None, "a member of a registered set"
        return rank, size

    def _assign(self) -> None:
        self.rank, self.world_size = self._world()
        self.owners = assign_owners(self._sizes, self.world_size)
        self._owned = {p for p in self._trainable if self.owners[self._names[p]] == self.rank}
        self._foreign = [p for p in self._trainable if p not in self._owned]

    def owns(self, p: torch.Tensor) -> bool:
        """Whether this rank owns (and steps) parameter ``p``."""
        return p in self._owned

    def _drop_foreign_state(self) -> None:
        state = self._opt.state
        if len(state) > len(self._owned):
            for p in self._foreign:
                state.pop(p, None)

    def _held(self) -> list[str]:
        return sorted(self._names[p] for p, entry in self._opt.state.items() if entry and p in self._names)

    def enter_world(self) -> None:
        """Before a step: the first in a new engine (an elastic reset, a re-init) re-shards (collective)."""
        if not self._communicate:
            return
        if self._engine is not None and self._engine() is engine_state.engine:
            return
        self.reshard()

    def reshard(self) -> bool:
        """Recompute the owners for the current set and move each parameter's state to its owner
        (collective over the set). Returns whether no rank holds any state."""
        self._assign()
        if not self._communicate:
            self._engine = None
            return not self._held()
        process_set = self._opt.process_set
        rows = allgather_object(self._held(), name="DistributedOptimizer.shards.held",
                                process_set=process_set)
        moves, lost = plan_moves(rows, self.owners)
        received: dict[str, Any] = {}
        for sender in sorted(moves):
            outgoing = None
            if sender == self.rank:
                outgoing = {name: _to_cpu(self._opt.state[self._by_name[name]]) for name in moves[sender]}
            got = broadcast_object(outgoing, process_set.ranks[sender],
                                   name=f"DistributedOptimizer.shards.from{sender}", process_set=process_set)
            received.update({name: entry for name, entry in got.items() if moves[sender][name] == self.rank})
        if received:
            self._install(received, replace=False)
        self._drop_foreign_state()
        empty = not any(rows)
        if lost and not empty and self.rank == 0:
            log.warning("sharded optimizer: the state of %d of %d parameters was held by ranks that left "
                        "(%s%s); it starts afresh on the new owners", len(lost), len(self.owners),
                        ", ".join(lost[:5]), ", ..." if len(lost) > 5 else "")
        self._engine = weakref.ref(engine_state.require())
        return empty

    # --- a step ------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None) -> Any:
        """The wrapped optimizer's step on the owned parameters, then the exchange of parameters."""
        self.enter_world()
        hidden = []
        for p in self._foreign:
            if p.grad is not None:
                hidden.append((p, p.grad))
                p.grad = None
        step = unhooked_step(self._base)  # the step hooks run once, around the optimizer's step()
        try:
            loss = step(self._opt) if closure is None else step(self._opt, closure)
        finally:
            for p, grad in hidden:
                p.grad = grad
        self._drop_foreign_state()
        self.exchange()
        return loss

    @torch.no_grad()
    def exchange(self) -> None:
        """Make every parameter whole on every rank: per bucket, an in-place Sum allreduce of the owned
        parameters and zeros for the others."""
        if not self._communicate or self.world_size == 1:
            return
        opt = self._opt
        handles = []
        for index, members in enumerate(opt._buckets):
            if not members:
                continue
            tensors = []
            for p in members:
                data = p.detach()
                if p not in self._owned:
                    data.zero_()
                tensors.append(data)
            handles.append(mpi_ops.grouped_allreduce_async_(
                tensors, name=f"{opt._bucket_names[index]}.params", op=mpi_ops.Sum,
                process_set=opt.process_set))
        for handle in handles:
            mpi_ops.synchronize(handle)

    # --- hvd.broadcast_optimizer_state -------------------------------------------------------

    def broadcast(self, root_rank: int, model: torch.nn.Module | None) -> None:
        """``hvd.broadcast_optimizer_state`` of a sharded optimizer (collective; see the module's text)."""
        empty = self.reshard() if self._communicate else not self._opt.state
        if empty:
            _initialize_state(self._opt, model)
        if not self._communicate:
            return
        options = [{k: v for k, v in group.items() if k != "params"} for group in self._opt.param_groups]
        received = broadcast_object(options, root_rank, name="DistributedOptimizer.shards.options",
                                    process_set=self._opt.process_set)
        for group, values in zip(self._opt.param_groups, received):
            group.update(values)

    # --- state dicts -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard (see the module's text)."""
        packed: dict[str, Any] = self._base.state_dict(self._opt)
        mine = {self.index_names[int(index)]: entry for index, entry in packed["state"].items()}
        packed["state"] = {}
        packed[KEY] = {"world": self.world_size, "rank": self.rank, "owners": dict(self.owners),
                       "params": list(self.index_names), "state": mine}
        return packed

    def load_state_dict(self, state_dict: Any) -> Any:
        """Take this rank's shard, every rank's shards (a list), or an unsharded state dict; returns
        PowerSGD's entry for this rank (or None), which the optimizer loads."""
        if isinstance(state_dict, list | tuple):
            ordered = _check_world(state_dict)
            self._check_params(ordered[0][KEY]["params"])
            entries = self._owned_entries(_entries_of(ordered))
            groups = ordered[0]["param_groups"]
            same = int(ordered[0][KEY]["world"]) == self.world_size
            powersgd = ordered[self.rank].get(POWERSGD_KEY) if same else _powersgd_of(ordered)
        elif is_shard(state_dict):
            info = state_dict[KEY]
            if int(info["world"]) == 1:
                return self.load_state_dict([state_dict])
            self._check_params(info["params"])
            if int(info["world"]) == self.world_size and int(info["rank"]) == self.rank:
                if dict(info["owners"]) != self.owners:
                    raise ValueError("the shard's owners differ from this optimizer's: it was saved by "
                                     "another model or optimizer. HINT: load a state dict of this model.")
                entries = dict(info["state"])
            elif self._elastic:
                # an elastic restore after the world changed: hold it, the next re-shard sends it on
                entries = dict(info["state"])
            else:
                raise ValueError(
                    f"this is the shard of rank {info['rank']} of {info['world']}; this is rank "
                    f"{self.rank} of {self.world_size}, which owns other parameters. HINT: load the list of "
                    "every rank's state_dict() (each rank takes what it owns at any world size), or this "
                    "rank's own shard.")
            groups = state_dict["param_groups"]
            powersgd = state_dict.get(POWERSGD_KEY)
        else:
            groups = state_dict["param_groups"]
            count = sum(len(g["params"]) for g in groups)
            if count != len(self.index_names):
                raise ValueError(f"the state dict has {count} parameters, this optimizer "
                                 f"{len(self.index_names)}. HINT: load a state dict of this model.")
            named = {self.index_names[int(index)]: entry for index, entry in state_dict["state"].items()}
            entries = self._owned_entries(named)
            powersgd = state_dict.get(POWERSGD_KEY)
        self._install(copy.deepcopy(entries), replace=True, groups=groups)
        return powersgd

    def _check_params(self, params: Sequence[str]) -> None:
        if list(params) != self.index_names:
            theirs, ours = set(params), set(self.index_names)
            detail = (f"missing here: {sorted(theirs - ours)[:5]}, not saved: {sorted(ours - theirs)[:5]}"
                      if theirs != ours else "the same names in another order")
            raise ValueError(f"the shards name other parameters than this optimizer ({detail}). HINT: load "
                             "a state dict of this model, its optimizer built the same way (the same "
                             "named_parameters and parameter groups).")

    def _owned_entries(self, entries: Mapping[str, Any]) -> dict[str, Any]:
        return {name: entry for name, entry in entries.items() if self.owners.get(name) == self.rank}

    def _install(self, entries: Mapping[str, Any], replace: bool, groups: Any = None) -> None:
        """Put state entries (by name) into the optimizer through the wrapped class's load_state_dict,
        which casts them to each parameter's device and dtype as torch does."""
        packed: dict[str, Any] = self._base.state_dict(self._opt)
        state = {} if replace else dict(packed["state"])
        for name, entry in entries.items():
            state[self._position[name]] = entry
        packed["state"] = state
        if groups is not None:
            packed["param_groups"] = groups
        self._base.load_state_dict(self._opt, packed)

    # --- the report --------------------------------------------------------------------------

    def report(self) -> ShardingReport:
        """This rank's part (collective: every rank's state bytes are gathered)."""
        mine = sum(_nbytes(entry) for entry in self._opt.state.values())
        by_rank = [mine]
        if self._communicate and self.world_size > 1:
            gathered = mpi_ops.allgather(torch.tensor([mine], dtype=torch.int64),
                                         name="DistributedOptimizer.shards.bytes",
                                         process_set=self._opt.process_set)
            by_rank = [int(v) for v in gathered.tolist()]
        owned = tuple(sorted(self._names[p] for p in self._owned))
        return ShardingReport(sharded=True, rank=self.rank, world_size=self.world_size, owned=owned,
                              parameters=len(self._trainable),
                              owned_elements=sum(p.numel() for p in self._owned),
                              total_elements=sum(p.numel() for p in self._trainable),
                              state_bytes=mine, state_bytes_by_rank=tuple(by_rank))


def unsharded_report(optimizer: torch.optim.Optimizer, rank: int = 0, world_size: int = 1) -> ShardingReport:
    """The report of an unsharded optimizer: every rank owns everything (no communication)."""
    trainable = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    names = getattr(optimizer, "_parameter_names", {})
    mine = sum(_nbytes(entry) for entry in optimizer.state.values())
    elements = sum(p.numel() for p in trainable)
    return ShardingReport(sharded=False, rank=rank, world_size=world_size,
                          owned=tuple(sorted(names.get(p, str(i)) for i, p in enumerate(trainable))),
                          parameters=len(trainable), owned_elements=elements, total_elements=elements,
                          state_bytes=mine, state_bytes_by_rank=(mine,))


__all__ = ["KEY", "ShardingReport", "assign_owners", "consolidate", "is_shard", "plan_moves", "split"]
