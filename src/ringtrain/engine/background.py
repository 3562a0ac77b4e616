"""The background thread: negotiation rounds, agreed execution, join, shutdown and failure handling.

All state below the "thread-owned" comment is touched only by the engine thread; user threads talk to
it through ``_incoming`` and a few flags guarded by one condition variable. Decisions that change
replicated state (cache, process sets, join bookkeeping) are taken from data every rank sees in the
same round, so the copies never diverge.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ringtrain.engine import control_plane, hierarchical
from ringtrain.engine import negotiation as neg
from ringtrain.engine.cache import ResponseCache
from ringtrain.engine.executor import (
    SetGroups,
    mesh_allreduce,
    reduce_in_rank_order,
    run_allreduce,
    run_single,
    scale_,
)
from ringtrain.engine.fusion import fusion_key, plan_batches
from ringtrain.engine.handles import HandleManager
from ringtrain.engine.requests import AVERAGE, SUM, OpType, Request, RequestMeta, Response
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.store import World, env_seconds, make_gloo_group, make_nccl_group
from ringtrain.engine.timeline import Timeline
from ringtrain.exceptions import HorovodInternalError

log = logging.getLogger("ringtrain.engine")

SHUT_DOWN_MESSAGE = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to "
    "allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown "
    "was caused by an exception, you should see the exception in the log before the first shutdown message."
)
DUPLICATE_NAME_MESSAGE = (
    "Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor that is "
    "currently being processed.  If you want to request another tensor, use a different tensor name. "
    "(name: {name})"
)

_CACHEABLE = {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.REDUCESCATTER, OpType.BARRIER}
#: Small Sum/Average allreduces travel inside the round vector (float64): at most this many elements
#: per request; RINGTRAIN_EAGER_ELEMENTS bounds the total (0 turns the shortcut off).
_EAGER_MAX_ELEMENTS = 512
_EAGER_DTYPES = {"float16", "bfloat16", "float32", "float64", "int32", "int16", "int8", "uint8"}
#: Longest sleep between rounds while something is pending but nothing moves. A rank with nothing of
#: its own pending is woken at once by its next submission, so a long cap costs no latency there and
#: keeps a rank that computes while others wait for it from spending its core on empty rounds.
_MAX_BACKOFF_S = 0.05
#: Rounds whose gathered vectors (all ranks together) fit in this many bytes use an allgather.
_GATHER_ROUND_BYTES = 256 * 1024
#: Round period of a fully idle engine (keeps stall reports flowing; costs ~nothing).
_IDLE_PERIOD_S = 1.0


def _display(ident: tuple[int, str]) -> str:
    """A request's name as the stall warning shows it (process set named when not global)."""
    set_id, key = ident
    return key if set_id == 0 else f"{key} (process set {set_id})"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(float(value))
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer. HINT: set {name} to a whole number.") from None


class Engine:
    """One per initialized process: owns the control group, data groups and the background thread."""

    def __init__(self, world: World, static_sets: list[list[int]] | None = None) -> None:
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.handles = HandleManager()
        self.cache = ResponseCache(_env_int("HOROVOD_CACHE_CAPACITY", 1024))
        self.fusion_threshold = _env_int("HOROVOD_FUSION_THRESHOLD", 128 * 1024 * 1024)
        self.cycle_time = env_seconds("HOROVOD_CYCLE_TIME", 1.0) / 1000.0
        self.stall = StallInspector()
        self.timeline = Timeline()
        # A round may legitimately wait very long for a slow rank (evaluation, checkpointing); a dead
        # peer is detected by the broken connection, not by this timeout.
        round_timeout = env_seconds("RINGTRAIN_ROUND_TIMEOUT_SECONDS", 7 * 24 * 3600.0)
        self.ctrl = make_gloo_group(world, "control", list(range(self.size)), timeout_s=round_timeout)
        self.plane = self._connect_plane(round_timeout)
        self.cpu_ring = self.plane is not None and self._agree("ctrl/cpu_allreduce",
                                                               control_plane.cpu_allreduce_from_env) == "ring"
        self.topology = hierarchical.Topology.discover(world, self.ctrl, self._agree)
        self.sets: dict[int, SetGroups] = {}
        self._fusion_buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._next_set_id = 0
        self.add_set(list(range(self.size)))
        for ranks in static_sets or []:
            self.add_set(ranks)
        self.homogeneous = self._check_homogeneous()

        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._active: dict[int, set[str]] = {}
        self._wake = False
        self._join_handle: int | None = None
        self._stop_requested = False
        self._stop_reason = SHUT_DOWN_MESSAGE
        self.stopped = False
        self.broken: str | None = None
        self._round_lock = threading.Lock()
        self._drivers = 0
        self._last_state: tuple[bool, bool, bool, bool] = (False, False, False, False)
        self.eager_budget = _env_int("RINGTRAIN_EAGER_ELEMENTS", 2048)
        self._eager: dict[int, tuple[int, int]] = {}
        self._eager_size = 0
        self._eager_version = -1

        # Thread-owned state.
        self._pending: dict[tuple[int, str], Request] = {}
        self._resend: list[RequestMeta] = []
        self._table: dict[tuple[int, str], dict[int, RequestMeta]] = {}
        self._table_seen: dict[tuple[int, str], float] = {}
        self._joined_prev: set[int] = set()
        self._join_order: list[int] = []
        self._backoff = self.cycle_time
        self._last_flags: list[int] = [0] * self.size

        self._thread = threading.Thread(target=self._main, name="ringtrain-engine", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- setup
    def add_set(self, ranks: list[int]) -> int:
        """Register a process set locally and build its data group (members only)."""
        set_id = self._next_set_id
        self._next_set_id += 1
        tag = f"set{set_id}"
        world = self.world
        gloo = None
        if set_id == 0:
            # The global set's data runs on the control group: the same thread issues both, in the
            # agreed order, and staying on one group keeps gloo's worker threads warm.
            gloo = self.ctrl
        elif self.rank in ranks:
            gloo = make_gloo_group(world, tag, ranks)
        groups = SetGroups(
            set_id=set_id,
            ranks=list(ranks),
            gloo=gloo,
            make_nccl=lambda: make_nccl_group(world, tag, list(ranks)),
            # CPU allreduces may travel over the control plane's sockets (see executor.run_allreduce).
            plane=self.plane,
            ring=self.cpu_ring,
            buffers=self._fusion_buffers,
            keep_bytes=self.fusion_threshold,
        )
        if self.rank in ranks:
            groups.extra["set_rank"] = ranks.index(self.rank)
            groups.extra["hierarchy"] = hierarchical.Hierarchy(self.topology, world, groups)
        self.sets[set_id] = groups
        return set_id

    def _connect_plane(self, round_timeout: float) -> control_plane.ControlPlane | None:
        """The socket mesh for rounds, or None where rounds go through gloo (rank 0 decides)."""
        if self.size == 1:
            return None
        store = self.world.store

        def mode() -> str:
            return "gloo" if self.size > control_plane.DEFAULT_MAX_RANKS else control_plane.mode_from_env()

        if self._agree("ctrl/mode", mode) != "tcp":
            return None
        return control_plane.ControlPlane.connect(
            store,
            self.rank,
            self.size,
            self.world.main_address,
            timeout_s=env_seconds("HOROVOD_GLOO_TIMEOUT_SECONDS", 300.0),
            round_timeout_s=round_timeout,
        )

    def _agree(self, key: str, choose: Callable[[], str]) -> str:
        """A setting every rank must share: rank 0's choice, published through the store."""
        if self.rank == 0:
            self.world.store.set(key, choose())
        return self.world.store.get(key).decode()

    def _check_homogeneous(self) -> bool:
        mine = torch.tensor([self.world.local_size], dtype=torch.int64)
        if self.size == 1:
            return True
        out = [torch.empty(1, dtype=torch.int64) for _ in range(self.size)]
        self.ctrl.allgather([out], [mine]).wait()
        return len({int(t.item()) for t in out}) == 1

    # ------------------------------------------------------------ user side
    def submit(
        self,
        build: Callable[[int], tuple[RequestMeta, list[torch.Tensor], list[torch.Tensor | None]]],
        finish: Callable[[Any], Any] | None = None,
        keepalive: Any = None,
        drive: bool = False,
    ) -> int:
        """Enqueue a request; ``build(handle)`` makes its metadata (auto names use the handle)."""
        with self._cv:
            self._check_alive()
            number, handle = self.handles.allocate(finish)
            try:
                meta, inputs, outputs = build(number)
                active = self._active.setdefault(meta.set_id, set())
                for name in meta.names:
                    if name in active:
                        raise ValueError(DUPLICATE_NAME_MESSAGE.format(name=name))
            except BaseException:
                self.handles.discard(number)
                raise
            handle.keepalive = keepalive
            active.update(meta.names)
            events = None
            if meta.device >= 0:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(meta.device))
                events = [event]
            self._incoming.append(
                Request(meta=meta, handle=number, inputs=inputs, outputs=outputs, ready_events=events)
            )
            self._wake = True
            if drive:
                # The caller synchronizes right away and will run the rounds itself: keep the
                # background thread out of the way instead of waking it.
                handle.driving = True
                self._drivers += 1
            else:
                self._cv.notify()
        return number

    def join(self) -> int:
        """Mark this rank joined; the handle completes with the last rank to join."""
        with self._cv:
            self._check_alive()
            number, _ = self.handles.allocate()
            self._join_handle = number
            self._wake = True
            self._cv.notify()
        return number

    def _check_alive(self) -> None:
        if self.broken is not None:
            raise HorovodInternalError(self.broken)
        if self.stopped or self._stop_requested:
            raise HorovodInternalError(SHUT_DOWN_MESSAGE)

    def stop(self, timeout: float = 60.0) -> None:
        """Leave the rounds (all ranks leave in the round where any rank asks) and fail what is left."""
        with self._cv:
            self._stop_requested = True
            self._wake = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self.stopped = True
        if self.plane is not None:
            self.plane.close()
        self.handles.fail_all(self.broken or SHUT_DOWN_MESSAGE, HorovodInternalError)
        self.timeline.stop()

    # ---------------------------------------------------------------- thread
    def _main(self) -> None:
        while not self.stopped:
            self._wait_next(*self._last_state)
            with self._cv:
                # A user thread blocked in synchronize() drives the rounds itself (no thread hand-off
                # on the busy path); this thread steps aside until it is done.
                if self._drivers:
                    while self._drivers and not self.stopped:
                        self._cv.wait(0.5)
                    continue
            with self._round_lock:
                if self.stopped or self._drivers:
                    continue
                state = self._step()
            if state is None:
                break

    def _step(self) -> tuple[bool, bool, bool, bool] | None:
        """One round with failure handling; None once the engine has stopped. Hold ``_round_lock``."""
        if self.stopped:
            return None
        try:
            state = self._round()
        except Exception as exc:  # noqa: BLE001 - any failure must reach every waiting handle
            self.broken = (
                f"{SHUT_DOWN_MESSAGE} (rank {self.rank}: a collective failed: {type(exc).__name__}: {exc})"
            )
            log.debug("engine failed", exc_info=True)
            state = None
        if state is not None:
            self._last_state = state
        if state is None:
            self.stopped = True
            if self.plane is not None:
                # Peers still waiting on this rank see end-of-file and stop too.
                self.plane.close()
            self.handles.fail_all(self.broken or self._stop_reason, HorovodInternalError)
            with self._cv:
                self._active.clear()
                self._cv.notify_all()
        return state

    def wait(self, number: int) -> None:
        """Block until handle ``number`` completes, running rounds on this thread meanwhile."""
        handle = self.handles.get(number)
        if handle is None:
            return
        if threading.current_thread() is self._thread:
            handle.done.wait()
            return
        with self._cv:
            if not handle.driving:
                handle.driving = True
                self._drivers += 1
        try:
            while not handle.done.is_set() and not self.stopped:
                with self._round_lock:
                    if handle.done.is_set():
                        break
                    state = self._step()
                if state is None:
                    break
                if not handle.done.is_set():
                    self._wait_next(*state)
        finally:
            with self._cv:
                self._drivers -= 1
                handle.driving = False
                if self._incoming or self._pending or self._stop_requested:
                    self._cv.notify_all()
        handle.done.wait()

    def _wait_next(self, progress: bool, mine_pending: bool, others_pending: bool, all_pending: bool) -> None:
        with self._cv:
            if self._wake or self._stop_requested:
                return
            if progress:
                self._backoff = self.cycle_time
            if mine_pending and not all_pending:
                # Someone we wait for has nothing pending: block inside the next round (in gloo, no CPU)
                # until that rank submits.
                return
            if mine_pending or others_pending:
                timeout = self._backoff
                if not progress:
                    self._backoff = min(max(self._backoff * 2, 1e-4), _MAX_BACKOFF_S)
            else:
                timeout = _IDLE_PERIOD_S
            if timeout > 0:
                self._cv.wait(timeout)

    def _round(self) -> tuple[bool, bool, bool, bool] | None:
        with self._cv:
            new = self._incoming
            self._incoming = []
            self._wake = False
            joining = self._join_handle is not None
            stopping = self._stop_requested
        self.timeline.cycle()
        to_send = self._resend
        self._resend = []
        for request in new:
            meta = request.meta
            ident = (meta.set_id, meta.key)
            self._pending[ident] = request
            slot = self.cache.lookup(*ident)
            cached = self.cache.response(slot) if slot is not None else None
            if cached is not None and cached.metas.get(self.rank) == meta:
                request.slot = slot
            else:
                request.slot = None
                to_send.append(meta)
            for name in meta.names:
                self.timeline.begin(name, f"NEGOTIATE_{meta.op.name}")
        stall_names: list[tuple[str, int]] = []
        if self._pending and not self.stall.disabled:
            oldest = min(r.submitted_at for r in self._pending.values())
            if self.rank != 0 and self.stall.should_report(time.monotonic() - oldest):
                stall_names = [(_display(ident), ident[0]) for ident in self._pending]
        payload = neg.encode_payload({"m": to_send, "s": stall_names}) if (to_send or stall_names) else b""
        flags = (
            (neg.FLAG_JOINED if joining else 0)
            | (neg.FLAG_SHUTDOWN if stopping else 0)
            | (neg.FLAG_PENDING if (self._pending or joining) else 0)
        )
        slots = [] if joining else [r.slot for r in self._pending.values() if r.slot is not None]
        num_slots = self.cache.num_slots
        layout, eager_size = self._eager_layout()
        vector = neg.build_vector(self.size, self.rank, num_slots, len(payload), flags, slots, eager_size)
        width = neg.HEADER_WIDTH * self.size
        eager_base = width + num_slots
        for request in self._pending.values():
            if request.slot is not None and request.slot in layout:
                self._write_eager(request, vector, eager_base + layout[request.slot][0])
        vector = self._exchange(vector)
        # One conversion to Python for the header and the slot counts (all small exact integers).
        control = [int(value) for value in vector[:eager_base].tolist()]
        lengths = control[0 : width : neg.HEADER_WIDTH]
        all_flags = control[1 : width : neg.HEADER_WIDTH]
        counts = control[width:]
        progress = False

        evicted: set[int] = set()
        cache_version = self.cache.version
        if any(lengths):
            progress = True
            now = time.monotonic()
            for rank, data in enumerate(self._gather(payload, lengths)):
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

        joined = {r for r in range(self.size) if all_flags[r] & neg.FLAG_JOINED}
        responses: list[Response] = []
        for slot, count in enumerate(counts):
            if count == 0 or slot in evicted:
                continue
            response = self.cache.response(slot)
            if response is None:
                continue
            members = self.sets[response.set_id].ranks if response.set_id in self.sets else []
            expected = [m for m in members if m not in joined]
            if count == len(expected):
                if slot in layout:
                    # Small Sum/Average allreduce: the round's sum already is the result.
                    offset, numel = layout[slot]
                    start = eager_base + offset
                    self._finish_eager(response, slot, vector[start : start + numel], len(members))
                    progress = True
                    continue
                if joined & set(members) and response.op not in (OpType.ALLREDUCE, OpType.BARRIER):
                    response = Response(
                        response.key,
                        response.set_id,
                        response.op,
                        response.metas,
                        neg.join_error(response.op),
                    )
                responses.append(response)
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

        if responses:
            progress = True
            self._execute(responses)
        if self.cache.version != cache_version:
            self._requeue_displaced()

        newly = sorted(joined - self._joined_prev)
        if newly:
            progress = True
        self._join_order.extend(newly)
        self._joined_prev = joined
        if joined and len(joined) == self.size:
            last = self._join_order[-1]
            self._joined_prev, self._join_order = set(), []
            with self._cv:
                number, self._join_handle = self._join_handle, None
            if number is not None:
                handle = self.handles.get(number)
                if handle is not None:
                    handle.outputs = last
                    handle.done.set()
            progress = True

        stall_watch = self.rank == 0 and not self.stall.disabled
        if stall_watch and (self._pending or self._table or self.stall.reports):  # noqa: SIM102
            if self.stall.check(self._waiting(joined)):
                with self._cv:
                    self._stop_requested = True
                    self._stop_reason = (
                        f"{SHUT_DOWN_MESSAGE} (stall: requests waited longer than "
                        f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={self.stall.shutdown_time:g})"
                    )

        if any(f & neg.FLAG_SHUTDOWN for f in all_flags):
            return None
        mine = bool(self._pending) or self._join_handle is not None
        others = any(f & neg.FLAG_PENDING for r, f in enumerate(all_flags) if r != self.rank)
        everyone = all(f & neg.FLAG_PENDING for f in all_flags)
        return progress, mine, others, everyone

    def _exchange(self, vector: torch.Tensor) -> torch.Tensor:
        """Sum every rank's round vector; the result is bit-identical on all ranks.

        A small vector is allgathered and summed here in rank order: over the socket mesh when there
        is one, else with one gloo ring pass instead of the allreduce's two (reduce-scatter, then
        allgather). Its length is a function of replicated state, so all ranks pick the same path.
        """
        if self.size == 1:
            return vector
        nbytes = vector.numel() * vector.element_size()
        if self.plane is not None and nbytes <= self.plane.max_message:
            mesh_allreduce(self.plane, vector, SUM)
            return vector
        if self.size * nbytes > _GATHER_ROUND_BYTES:
            self.ctrl.allreduce([vector]).wait()
            return vector
        rows = torch.empty(self.size, vector.numel(), dtype=vector.dtype)
        self.ctrl._allgather_base(rows.view(-1), vector).wait()
        return reduce_in_rank_order(rows.unbind(), SUM)

    def _eager_layout(self) -> tuple[dict[int, tuple[int, int]], int]:
        """Offsets of small cached Sum/Average CPU allreduces in the round vector (same on all ranks)."""
        if self._eager_version == self.cache.version:
            return self._eager, self._eager_size
        layout: dict[int, tuple[int, int]] = {}
        total = 0
        for slot in range(self.cache.num_slots):
            response = self.cache.response(slot)
            if response is None or response.op != OpType.ALLREDUCE:
                continue
            ref = response.reference
            if ref.device >= 0 or ref.reduce_op not in (AVERAGE, SUM) or len(set(ref.dtypes)) != 1:
                continue
            if ref.dtypes[0] not in _EAGER_DTYPES:
                continue
            numel = sum(math.prod(shape) for shape in ref.shapes)
            if numel == 0 or numel > _EAGER_MAX_ELEMENTS or total + numel > self.eager_budget:
                continue
            layout[slot] = (total, numel)
            total += numel
        self._eager, self._eager_size, self._eager_version = layout, total, self.cache.version
        return layout, total

    def _write_eager(self, request: Request, vector: torch.Tensor, start: int) -> None:
        prescale = request.meta.prescale
        for tensor in request.inputs:
            numel = tensor.numel()
            target = vector[start : start + numel]
            if prescale != 1.0 and not tensor.dtype.is_floating_point:
                # Integers are scaled (and truncated) before the reduction, as on the data path.
                scaled = tensor.reshape(-1).clone()
                scale_(scaled, prescale)
                target.copy_(scaled)
            else:
                target.copy_(tensor.reshape(-1))
                if prescale != 1.0:
                    target.mul_(prescale)
            start += numel

    def _finish_eager(self, response: Response, slot: int, summed: torch.Tensor, set_size: int) -> None:
        ident = (response.set_id, response.key)
        self.cache.touch(slot)
        request = self._pending.pop(ident, None)
        if self.rank == 0:
            self.stall.forget(_display(ident))
        if request is None:
            return
        ref = response.reference
        post = ref.postscale / set_size if ref.reduce_op == AVERAGE else ref.postscale
        if post != 1.0:
            summed = summed * post
        for name in request.meta.names:
            self.timeline.end(name, f"NEGOTIATE_{request.meta.op.name}")
            self.timeline.begin(name, "ALLREDUCE")
        offset = 0
        for i, tensor in enumerate(request.inputs):
            numel = tensor.numel()
            values = summed[offset : offset + numel]
            if not tensor.dtype.is_floating_point:
                values = values.trunc()
            out = request.outputs[i]
            if out is None:
                out = request.outputs[i] = torch.empty_like(tensor)
            out.reshape(-1).copy_(values)
            offset += numel
        for name in request.meta.names:
            self.timeline.end(name, "ALLREDUCE")
        self._complete(request, None)

    def _gather(self, payload: bytes, lengths: list[int]) -> list[bytes]:
        width = max(lengths)
        if self.plane is not None and width <= self.plane.max_message:
            return [bytes(data) for data in self.plane.allgather(payload)]
        send = torch.zeros(width, dtype=torch.uint8)
        if payload:
            send[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        recv = [torch.empty(width, dtype=torch.uint8) for _ in range(self.size)]
        self.ctrl.allgather([recv], [send]).wait()
        return [bytes(recv[r][: lengths[r]].numpy()) if lengths[r] else b"" for r in range(self.size)]

    def _requeue_evicted(self, ident: tuple[int, str], sender: int) -> None:
        """A rank re-sent a cached name with new metadata: our cached copy must be renegotiated too."""
        request = self._pending.get(ident)
        if request is not None and request.slot is not None:
            request.slot = None
            if sender != self.rank:
                self._resend.append(request.meta)

    def _requeue_displaced(self) -> None:
        """Pending requests whose cache entry was evicted (capacity, removed set) are renegotiated."""
        for ident, request in self._pending.items():
            if request.slot is None:
                continue
            entry = self.cache.response(request.slot)
            if entry is None or (entry.set_id, entry.key) != ident:
                request.slot = None
                if request.meta not in self._resend:
                    self._resend.append(request.meta)

    def _waiting(self, joined: set[int]) -> dict[str, tuple[float, set[int], list[int]]]:
        waiting: dict[str, tuple[float, set[int], list[int]]] = {}
        for ident, metas in self._table.items():
            groups = self.sets.get(ident[0])
            expected = [m for m in (groups.ranks if groups else []) if m not in joined]
            seen = self._table_seen.get(ident, time.monotonic())
            waiting[_display(ident)] = (seen, set(metas), expected)
        for ident, request in self._pending.items():
            groups = self.sets.get(ident[0])
            expected = [m for m in (groups.ranks if groups else []) if m not in joined]
            seen, submitted, _ = waiting.get(_display(ident), (request.submitted_at, set(), expected))
            waiting[_display(ident)] = (min(seen, request.submitted_at), submitted | {self.rank}, expected)
        for rank, reported in self.stall.reports.items():
            for name, (first, set_id) in reported.items():
                groups = self.sets.get(set_id)
                expected = [m for m in (groups.ranks if groups else []) if m not in joined]
                seen, submitted, _ = waiting.get(name, (first, set(), expected))
                waiting[name] = (min(seen, first), submitted | {rank}, expected)
        return waiting

    # ------------------------------------------------------------- execution
    def _execute(self, responses: list[Response]) -> None:
        runnable: list[tuple[Response, Request | None]] = []
        for response in responses:
            ident = (response.set_id, response.key)
            request = self._pending.pop(ident, None)
            if request is not None:
                for name in request.meta.names:
                    self.timeline.end(name, f"NEGOTIATE_{request.meta.op.name}")
            if self.rank == 0:
                self.stall.forget(_display(ident))
            if response.error is not None:
                self._complete(request, response.error)
                continue
            slot = self.cache.lookup(*ident)
            if slot is not None:
                self.cache.touch(slot)
            if response.op in (OpType.BARRIER, OpType.PROCESS_SET_ADD, OpType.PROCESS_SET_REMOVE):
                result = self._apply_control(response)
                if request is not None:
                    request.extra["result"] = result
                self._complete(request, None)
                continue
            groups = self.sets.get(response.set_id)
            if groups is None or self.rank not in groups.ranks:
                self._complete(request, None)
                continue
            runnable.append((response, request))
        by_response = {id(resp): req for resp, req in runnable}
        for batch in plan_batches([resp for resp, _ in runnable], self.fusion_threshold):
            pairs = [(resp, by_response[id(resp)]) for resp in batch]
            groups = self.sets[batch[0].set_id]
            names = [name for resp in batch for name in resp.reference.names]
            phase = batch[0].op.name
            for name in names:
                self.timeline.begin(name, phase)
            if fusion_key(batch[0]) is not None:
                run_allreduce(pairs, groups)
            else:
                request = pairs[0][1]
                assert request is not None, f"{batch[0].op.name} without a local request"
                run_single(batch[0], request, groups)
            for name in names:
                self.timeline.end(name, phase)
            for _, request in pairs:
                self._complete(request, None)

    def _apply_control(self, response: Response) -> Any:
        ref = response.reference
        if response.op == OpType.PROCESS_SET_ADD:
            return self.add_set(list(ref.payload or ()))
        if response.op == OpType.PROCESS_SET_REMOVE:
            set_id = (ref.payload or (0,))[0]
            if set_id in self.sets and set_id != 0:
                del self.sets[set_id]
                self.cache.evict_set(set_id)
                return True
            return False
        return None

    def _complete(self, request: Request | None, error: str | None) -> None:
        if request is None:
            return
        with self._cv:
            active = self._active.get(request.meta.set_id)
            if active is not None:
                active.difference_update(request.meta.names)
        handle = self.handles.get(request.handle)
        if handle is None:
            return
        if error is not None:
            handle.error = error
            handle.error_type = HorovodInternalError
        else:
            handle.outputs = request
        handle.done.set()
