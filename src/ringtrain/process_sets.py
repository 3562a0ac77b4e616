"""Process sets: collectives over a subset of ranks (``hvd.ProcessSet``, ``hvd.add_process_set``).

Every set gets its own data group, built by its members at the same point of the agreed order on all
ranks. Ranks are global ranks, kept sorted; ``rank()`` is the position inside the set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ringtrain.engine import state
from ringtrain.engine.requests import OpType
from ringtrain.op_requests import control_op


class ProcessSet:
    """A sorted list of global ranks; registered sets have an integer ``process_set_id``."""

    def __init__(self, ranks_or_comm: Iterable[int] | Any) -> None:
        self.mpi_comm = None
        self.process_set_id: int | None = None
        if not isinstance(ranks_or_comm, (list, tuple, range, set, frozenset)):
            raise ValueError(
                f"ProcessSet({ranks_or_comm!r}): ringtrain has no MPI build, so process sets are lists of "
                "global ranks. HINT: pass a list of ints, e.g. ProcessSet([0, 1])."
            )
        ranks = list(ranks_or_comm)
        for r in ranks:
            if not isinstance(r, int) or isinstance(r, bool):
                raise ValueError(
                    f"ProcessSet ranks must be integers; got {r!r} in {ranks!r}. "
                    "HINT: pass global ranks such as [0, 2]."
                )
        self.ranks: list[int] = sorted(ranks)

    def _registered(self) -> bool:
        return self.process_set_id is not None and state.engine is not None

    def size(self) -> int | None:
        """Number of ranks in the set (None until registered)."""
        return len(self.ranks) if self._registered() else None

    def rank(self) -> int | None:
        """This process's rank within the set; -1 if not a member; None until registered."""
        if not self._registered():
            return None
        me = state.require().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None until registered)."""
        if not self._registered():
            return None
        return state.require().rank in self.ranks

    def __str__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"
        )

    __repr__ = __str__


#: All ranks; id 0, ranks filled in by ``init()``.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _dynamic_enabled() -> bool:
    return state.dynamic_sets or state.require().settings.dynamic_process_sets


def _find_duplicate(ranks: list[int]) -> Any:
    for ps in state.registered.values():
        if ps.ranks == ranks:
            return ps
    return None


def register_static(sets: list[ProcessSet], world_size: int) -> None:
    """Validate ``init(process_sets=[...])`` before the engine starts (ids are given afterwards)."""
    seen: list[list[int]] = [list(range(world_size))]
    for ps in sets:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"init(process_sets=...) expects ProcessSet objects or 'dynamic'; got {ps!r}.")
        if ps.ranks in seen:
            raise ValueError(
                f"{ps} is a duplicate of another process set. HINT: register each distinct rank "
                "list once (the global set already covers all ranks)."
            )
        bad = [r for r in ps.ranks if not 0 <= r < world_size]
        if bad:
            raise ValueError(
                f"{ps} names ranks {bad} outside the world of size {world_size}. "
                "HINT: use global ranks 0..size-1."
            )
        seen.append(ps.ranks)


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a new set on all ranks (collective: call it identically everywhere, in the same order)."""
    engine = state.require()
    if not _dynamic_enabled():
        raise ValueError(
            "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod initialization."
        )
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    duplicate = _find_duplicate(ps.ranks)
    if duplicate is not None or (ps.process_set_id is not None and ps.process_set_id in state.registered):
        raise ValueError(f"Attempted to add a duplicate process set: {ps}")
    bad = [r for r in ps.ranks if not 0 <= r < engine.size]
    if bad or not ps.ranks:
        raise ValueError(
            f"{ps} names ranks {bad} outside the world of size {engine.size}. "
            "HINT: use global ranks 0..size-1."
        )
    set_id = control_op(OpType.PROCESS_SET_ADD, "process_set.add", tuple(ps.ranks), global_process_set)
    ps.process_set_id = set_id
    state.registered[set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on all ranks (collective). False for the global set or an unregistered set."""
    state.require()
    if not _dynamic_enabled():
        raise ValueError(
            "Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after Horovod initialization."
        )
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0 or state.registered.get(set_id) is not process_set:
        return False
    removed = control_op(OpType.PROCESS_SET_REMOVE, "process_set.remove", (set_id,), global_process_set)
    state.registered.pop(set_id, None)
    process_set.process_set_id = None
    return bool(removed)


__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]
