"""The controller: what is ready on every rank, and in which order it runs.

Horovod keeps its controller (readiness, the response cache, join, stall checks) apart from the
operations that move the data and from the background thread that drives both. This module is that
controller; :mod:`ringtrain.engine.background` holds the thread and executes what the controller
decides. One :meth:`Controller.negotiate` call is one round:

1. admit the requests submitted since the last round: a name cached with the same metadata costs one
   slot count, anything else is sent with its metadata;
2. sum this rank's round vector (header, slot counts, eager data) over all ranks, and gather the
   metadata of new names when some rank has any (wire format and transport: :mod:`negotiation`);
3. decide the responses, in the same order on every rank: cached slots that every expected rank
   counted (the small Sum/Average allreduces of :mod:`eager` complete right here), then new names
   that every expected rank has sent, checked for agreement;
4. keep the join bookkeeping.

Every decision that changes replicated state (cache, table, join order) is taken from data every
rank sees in the same round, so the copies never diverge. After executing the responses, the
engine asks :meth:`Controller.stalled` (rank 0 watches for stalls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ringtrain.engine import eager
from ringtrain.engine import negotiation as neg
from ringtrain.engine.cache import ResponseCache
from ringtrain.engine.executor import SetGroups
from ringtrain.engine.requests import OpType, Request, RequestMeta, Response
from ringtrain.engine.settings import Settings
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.timeline import Timeline

_CACHEABLE = {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.REDUCESCATTER, OpType.BARRIER}
_NOTHING: frozenset[int] = frozenset()

#: (process set id, key): how requests are matched across ranks.
Ident = tuple[int, str]


def display_name(ident: Ident) -> str:
    """A request's name as the stall warning shows it (process set named when not global)."""
    set_id, key = ident
    return key if set_id == 0 else f"{key} (process set {set_id})"


@dataclass(slots=True)
class RoundResult:
    """What one round decided. ``ready``, ``joined``, ``last_joined`` and ``shutdown`` are the same on
    every rank; the ``*_pending`` flags are this rank's view, for pacing the next round."""

    #: Responses to execute, in order, each with this rank's request (None where it has none: a
    #: joined rank, or a rank outside the process set).
    ready: list[tuple[Response, Request | None]]
    #: Ranks inside ``hvd.join()``.
    joined: set[int]
    #: In the round where the last rank joined: the rank that joined last (join's result).
    last_joined: int | None
    #: Something moved (new names, results, joins): the next round comes without back-off.
    progress: bool
    #: This rank has requests (or a join) waiting.
    mine_pending: bool
    #: Another rank has requests waiting.
    others_pending: bool
    #: Every rank has requests waiting.
    all_pending: bool
    #: Another rank waits on a name whose process set leaves this rank out: only rounds that this rank
    #: takes part in (negotiation spans every rank) can settle it, so this rank keeps pacing rounds
    #: even with nothing of its own. A name that includes this rank needs its submission instead,
    #: which wakes it at once; rounds before that would only take CPU from its computation.
    others_need_rounds: bool
    #: Some rank is shutting down: every rank leaves the rounds now.
    shutdown: bool


#: The state before the first round: nothing pending anywhere.
IDLE = RoundResult([], set(), None, False, False, False, False, False, False)


class Controller:
    """Negotiation state of one engine: pending requests, the replicated table, cache, join, stalls.

    Runs on whichever thread drives the rounds (one at a time). ``complete(request, error)`` finishes
    a request the controller completes itself (the eager path).
    """

    def __init__(
        self,
        rank: int,
        size: int,
        settings: Settings,
        sets: dict[int, SetGroups],
        timeline: Timeline,
        ctrl: Any,
        plane: Any,
        complete: Callable[[Request | None, str | None], None],
    ) -> None:
        self.rank, self.size = rank, size
        #: The engine's process sets by id (shared: the engine adds and removes them).
        self.sets = sets
        self.timeline = timeline
        self.cache = ResponseCache(settings.cache_capacity)
        self.stall = StallInspector(
            settings.stall_check_time_s, settings.stall_shutdown_time_s, settings.stall_check_disable
        )
        self._ctrl, self._plane = ctrl, plane
        self._complete = complete
        #: This rank's requests not yet decided, by ident.
        self.pending: dict[Ident, Request] = {}
        self._resend: list[RequestMeta] = []
        #: Replicated: metadata of uncached names by ident and rank, and when each was first seen.
        self._table: dict[Ident, dict[int, RequestMeta]] = {}
        self._table_seen: dict[Ident, float] = {}
        self._joined_prev: set[int] = set()
        self._join_order: list[int] = []
        self._eager_budget = settings.eager_elements
        self._eager: dict[int, tuple[int, int]] = {}
        #: Elements of the round vector's eager part (same on all ranks).
        self.eager_size = 0
        self._eager_version = -1
        self._round_version = 0
        #: Rounds this rank has taken part in, and whether the last one saw another rank waiting.
        self.rounds = 0
        self.others_pending = False

    # ------------------------------------------------------------------ round
    def negotiate(self, new: list[Request], joining: bool, stopping: bool) -> RoundResult:
        """One round: admit ``new``, exchange, and decide what is ready (see the module docstring)."""
        self.rounds += 1
        self.timeline.cycle()
        if self.cache.version != self._round_version:
            self._requeue_displaced()
        payload = self._payload(self._admit(new))
        flags = (
            (neg.FLAG_JOINED if joining else 0)
            | (neg.FLAG_SHUTDOWN if stopping else 0)
            | (neg.FLAG_PENDING if (self.pending or joining) else 0)
        )
        slots = [] if joining else [r.slot for r in self.pending.values() if r.slot is not None]
        num_slots = self.cache.num_slots
        layout, eager_size = self._eager_layout()
        vector = neg.build_vector(self.size, self.rank, num_slots, len(payload), flags, slots, eager_size)
        width = neg.HEADER_WIDTH * self.size
        eager_base = width + num_slots
        for request in self.pending.values():
            if request.slot is not None and request.slot in layout:
                eager.write(request, vector, eager_base + layout[request.slot][0])
        vector = neg.exchange(vector, self._plane, self._ctrl, self.size)
        # One conversion to Python for the header and the slot counts (all small exact integers).
        control = [int(value) for value in vector[:eager_base].tolist()]
        lengths = control[0 : width : neg.HEADER_WIDTH]
        all_flags = control[1 : width : neg.HEADER_WIDTH]

        self._round_version = self.cache.version
        progress = any(lengths)
        evicted = self._record_metadata(payload, lengths) if progress else _NOTHING
        joined = {r for r in range(self.size) if all_flags[r] & neg.FLAG_JOINED}
        responses: list[Response] = []
        if self._ready_from_cache(control[width:], evicted, joined, layout, vector, eager_base, responses):
            progress = True
        if self._table:
            self._ready_from_table(joined, responses)
        ready = self._claim(responses) if responses else []
        last_joined, joins_moved = self._track_joins(joined) if joined or self._joined_prev else (None, False)
        others_pending = any(f & neg.FLAG_PENDING for r, f in enumerate(all_flags) if r != self.rank)
        self.others_pending = others_pending
        return RoundResult(
            ready=ready,
            joined=joined,
            last_joined=last_joined,
            progress=progress or bool(ready) or joins_moved,
            mine_pending=bool(self.pending) or (joining and last_joined is None),
            others_pending=others_pending,
            all_pending=all(f & neg.FLAG_PENDING for f in all_flags),
            others_need_rounds=others_pending and self._waiting_without_me(control[width:]),
            shutdown=any(f & neg.FLAG_SHUTDOWN for f in all_flags),
        )

    def _admit(self, new: list[Request]) -> list[RequestMeta]:
        """Take new requests in; return the metadata to send (names not cached with this metadata)."""
        to_send = self._resend
        self._resend = []
        for request in new:
            meta = request.meta
            ident = (meta.set_id, meta.key)
            self.pending[ident] = request
            slot = self.cache.lookup(*ident)
            cached = self.cache.response(slot) if slot is not None else None
            if cached is not None and cached.metas.get(self.rank) == meta:
                request.slot = slot
            else:
                request.slot = None
                to_send.append(meta)
            for name in meta.names:
                self.timeline.begin(name, f"NEGOTIATE_{meta.op.name}")
        return to_send

    def _payload(self, to_send: list[RequestMeta]) -> bytes:
        """New metadata, plus (ranks other than 0) the names pending long enough for a stall report."""
        stall_names: list[tuple[str, int]] = []
        if self.pending and not self.stall.disabled:
            oldest = min(r.submitted_at for r in self.pending.values())
            if self.rank != 0 and self.stall.should_report(time.monotonic() - oldest):
                stall_names = [(display_name(ident), ident[0]) for ident in self.pending]
        return neg.encode_payload({"m": to_send, "s": stall_names}) if (to_send or stall_names) else b""

    def _record_metadata(self, payload: bytes, lengths: list[int]) -> set[int]:
        """Gather every rank's new metadata into the table; returns the cache slots it evicted."""
        evicted: set[int] = set()
        now = time.monotonic()
        for rank, data in enumerate(neg.gather(payload, lengths, self._plane, self._ctrl, self.size)):
            if not data:
                continue
            message = neg.decode_payload(data)
            for meta in message["m"]:
                ident = (meta.set_id, meta.key)
                slot = self.cache.evict(*ident)
                if slot is not None:
                    evicted.add(slot)
                    self._requeue_evicted(ident, rank)
                self._table.setdefault(ident, {})[rank] = meta
                self._table_seen.setdefault(ident, now)
            if message["s"] and self.rank == 0:
                self.stall.record_report(rank, message["s"])
        return evicted

    def _ready_from_cache(
        self,
        counts: list[int],
        evicted: frozenset[int] | set[int],
        joined: set[int],
        layout: dict[int, tuple[int, int]],
        vector: torch.Tensor,
        eager_base: int,
        responses: list[Response],
    ) -> bool:
        """Cached names every expected rank counted; eager ones complete here (True when any did)."""
        progress = False
        for slot, count in enumerate(counts):
            if count == 0 or slot in evicted:
                continue
            response = self.cache.response(slot)
            if response is None:
                continue
            members = self.sets[response.set_id].ranks if response.set_id in self.sets else []
            expected = [m for m in members if m not in joined]
            if count != len(expected):
                continue
            if slot in layout:
                # Small Sum/Average allreduce: the round's sum already is the result.
                offset, numel = layout[slot]
                start = eager_base + offset
                self._finish_eager(response, slot, vector[start : start + numel], len(members))
                progress = True
                continue
            if joined & set(members) and response.op not in (OpType.ALLREDUCE, OpType.BARRIER):
                response = Response(
                    response.key, response.set_id, response.op, response.metas, neg.join_error(response.op)
                )
            responses.append(response)
        return progress

    def _ready_from_table(self, joined: set[int], responses: list[Response]) -> None:
        """New names every expected rank has sent: checked for agreement, cached when they may be."""
        for ident, metas in list(self._table.items()):
            set_id = ident[0]
            groups = self.sets.get(set_id)
            members = groups.ranks if groups is not None else sorted(metas)
            expected = [m for m in members if m not in joined]
            if not metas or not all(m in metas for m in expected):
                continue
            del self._table[ident]
            self._table_seen.pop(ident, None)
            op = metas[min(metas)].op
            error = None
            if groups is None:
                error = f"Process set {set_id} has been removed."
            if error is None:
                error = neg.check_agreement(metas)
            if error is None and joined & set(members) and op not in (OpType.ALLREDUCE, OpType.BARRIER):
                error = neg.join_error(op)
            response = Response(ident[1], set_id, op, metas, error)
            if error is None and op in _CACHEABLE:
                self.cache.insert(response)
            responses.append(response)

    def _claim(self, responses: list[Response]) -> list[tuple[Response, Request | None]]:
        """Pair each response with this rank's request (taken out of pending); mark its cache entry used."""
        ready: list[tuple[Response, Request | None]] = []
        for response in responses:
            ident = (response.set_id, response.key)
            request = self.pending.pop(ident, None)
            if request is not None:
                for name in request.meta.names:
                    self.timeline.end(name, f"NEGOTIATE_{request.meta.op.name}")
            if self.rank == 0:
                self.stall.forget(display_name(ident))
            if response.error is None:
                slot = self.cache.lookup(*ident)
                if slot is not None:
                    self.cache.touch(slot)
            ready.append((response, request))
        return ready

    def _waiting_without_me(self, counts: list[int]) -> bool:
        """Whether a name some rank waits on (a counted cache slot, or metadata in the table) belongs
        to a process set this rank is not in (or to one it does not know)."""
        set_ids = {ident[0] for ident in self._table}
        for slot, count in enumerate(counts):
            response = self.cache.response(slot) if count else None
            if response is not None:
                set_ids.add(response.set_id)
        return any(set_id not in self.sets or self.rank not in self.sets[set_id].ranks for set_id in set_ids)

    def _track_joins(self, joined: set[int]) -> tuple[int | None, bool]:
        """Record the order ranks joined in; (the last one once all have, whether anything changed)."""
        newly = sorted(joined - self._joined_prev)
        self._join_order.extend(newly)
        self._joined_prev = joined
        if joined and len(joined) == self.size:
            last = self._join_order[-1]
            self._joined_prev, self._join_order = set(), []
            return last, True
        return None, bool(newly)

    def _requeue_displaced(self) -> None:
        """Pending requests whose cache entry went last round (capacity, a removed set) are renegotiated.

        Run at the start of the next round rather than after the executions (a process set's removal
        evicts its entries there): either way their metadata goes out with that next round.
        """
        for ident, request in self.pending.items():
            if request.slot is None:
                continue
            entry = self.cache.response(request.slot)
            if entry is None or (entry.set_id, entry.key) != ident:
                request.slot = None
                if request.meta not in self._resend:
                    self._resend.append(request.meta)

    def _requeue_evicted(self, ident: Ident, sender: int) -> None:
        """A rank re-sent a cached name with new metadata: our cached copy must be renegotiated too."""
        request = self.pending.get(ident)
        if request is not None and request.slot is not None:
            request.slot = None
            if sender != self.rank:
                self._resend.append(request.meta)

    # ------------------------------------------------------------- after a round
    def stalled(self, joined: set[int]) -> bool:
        """Rank 0: warn about names waiting too long; True once the stall shutdown time has passed."""
        if self.rank != 0 or self.stall.disabled:
            return False
        if not (self.pending or self._table or self.stall.reports):
            return False
        return self.stall.check(self._waiting(joined))

    def _waiting(self, joined: set[int]) -> dict[str, tuple[float, set[int], list[int]]]:
        waiting: dict[str, tuple[float, set[int], list[int]]] = {}
        for ident, metas in self._table.items():
            groups = self.sets.get(ident[0])
            expected = [m for m in (groups.ranks if groups else []) if m not in joined]
            seen = self._table_seen.get(ident, time.monotonic())
            waiting[display_name(ident)] = (seen, set(metas), expected)
        for ident, request in self.pending.items():
            groups = self.sets.get(ident[0])
            expected = [m for m in (groups.ranks if groups else []) if m not in joined]
            name = display_name(ident)
            seen, submitted, _ = waiting.get(name, (request.submitted_at, set(), expected))
            waiting[name] = (min(seen, request.submitted_at), submitted | {self.rank}, expected)
        for rank, reported in self.stall.reports.items():
            for name, (first, set_id) in reported.items():
                groups = self.sets.get(set_id)
                expected = [m for m in (groups.ranks if groups else []) if m not in joined]
                seen, submitted, _ = waiting.get(name, (first, set(), expected))
                waiting[name] = (min(seen, first), submitted | {rank}, expected)
        return waiting

    # ------------------------------------------------------------------ eager
    def _eager_layout(self) -> tuple[dict[int, tuple[int, int]], int]:
        if self._eager_version != self.cache.version:
            self._eager, self.eager_size = eager.layout(self.cache, self._eager_budget)
            self._eager_version = self.cache.version
        return self._eager, self.eager_size

    def _finish_eager(self, response: Response, slot: int, summed: torch.Tensor, set_size: int) -> None:
        ident = (response.set_id, response.key)
        self.cache.touch(slot)
        request = self.pending.pop(ident, None)
        if self.rank == 0:
            self.stall.forget(display_name(ident))
        if request is None:
            return
        for name in request.meta.names:
            self.timeline.end(name, f"NEGOTIATE_{request.meta.op.name}")
            self.timeline.begin(name, "ALLREDUCE")
        eager.finish(response, request, summed, set_size)
        for name in request.meta.names:
            self.timeline.end(name, "ALLREDUCE")
        self._complete(request, None)
