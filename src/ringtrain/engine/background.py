"""The background thread and its mechanics: submission, wake-up, waiting, driving, failure, execution.

What to run and in which order is the controller's decision (:mod:`ringtrain.engine.controller`);
this module holds the thread that runs the rounds, the user-facing side (``submit``, ``join``,
``wait``, ``stop``), the pacing between rounds, and the execution of agreed responses on the data
groups (:mod:`ringtrain.engine.executor`). User threads talk to the round thread through
``_incoming`` and a few flags guarded by one condition variable; a user thread blocked in
``synchronize()`` runs the rounds itself (``_round_lock`` keeps it to one driver at a time).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ringtrain.engine import liveness
from ringtrain.engine.control_plane import node_identity
from ringtrain.engine.controller import IDLE, Controller, RoundResult
from ringtrain.engine.executor import run_allreduce, run_single
from ringtrain.engine.fusion import fusion_key, plan_batches
from ringtrain.engine.groups import EngineGroups
from ringtrain.engine.handles import HandleManager
from ringtrain.engine.netutil import candidate_addresses
from ringtrain.engine.requests import OpType, Request, RequestMeta, Response
from ringtrain.engine.settings import Settings
from ringtrain.engine.timeline import Timeline
from ringtrain.engine.world_rendezvous import World
from ringtrain.exceptions import ControlPlaneError, HorovodInternalError

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

_CONTROL_OPS = (OpType.BARRIER, OpType.PROCESS_SET_ADD, OpType.PROCESS_SET_REMOVE)
#: Longest sleep between rounds while something is pending but nothing moves. A rank with nothing of
#: its own pending is woken at once by its next submission, so a long cap costs no latency there and
#: keeps a rank that computes while others wait for it from spending its core on empty rounds.
_MAX_BACKOFF_S = 0.05
#: Arrivals kept for the launcher's watch, and names whose submissions are counted.
_ARRIVALS_KEPT = 256
_ARRIVAL_NAMES_KEPT = 65536
#: Round period of a fully idle engine (keeps stall reports flowing; costs ~nothing).
_IDLE_PERIOD_S = 1.0
#: A rank that others wait on while it computes takes part in a round this often (at most): their stall
#: reports reach rank 0 through these rounds, which a quarter of the stall check time keeps timely.
_WAITED_ON_PERIODS_PER_STALL_CHECK = 4


class Engine:
    """One per initialized process: owns the control group, data groups and the background thread."""

    def __init__(self, world: World, settings: Settings, static_sets: list[list[int]] | None = None) -> None:
        self.world = world
        self.settings = settings
        self.rank, self.size = world.rank, world.size
        self.handles = HandleManager()
        self.fusion_threshold = settings.fusion_threshold_bytes
        self.cycle_time = settings.cycle_time_ms / 1000.0
        self.timeline = Timeline()
        #: Triggered when a peer is declared failed: every wait of this engine ends (engine.liveness).
        self.abort = liveness.Abort()
        liveness.current = self.abort
        self.broken: str | None = None
        self.groups = EngineGroups(world, settings, self.abort)
        self.ctrl, self.plane, self.cpu_ring = self.groups.ctrl, self.groups.plane, self.groups.cpu_ring
        #: Data groups of every process set, by id (the controller reads the same dict).
        self.sets = self.groups.sets
        for ranks in [list(range(self.size)), *(static_sets or [])]:
            self.groups.add_set(ranks)
        self.heartbeats = self._start_heartbeats()
        try:
            self.homogeneous = self.groups.is_homogeneous()
        except BaseException:
            self._stop_heartbeats()
            raise
        self.controller = Controller(
            self.rank, self.size, settings, self.sets, self.timeline, self.ctrl, self.plane, self._complete
        )

        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._active: dict[int, set[str]] = {}
        self._wake = False
        self._join_handle: int | None = None
        self._stop_requested = False
        self._stop_reason = SHUT_DOWN_MESSAGE
        self.stopped = False
        #: Requests of this rank finished (ok or not) since start.
        self.completed = 0
        #: (name#occurrence, when submitted) of the newest requests, read by the launcher's watch.
        self.arrivals: collections.deque[tuple[str, float]] = collections.deque(maxlen=_ARRIVALS_KEPT)
        self._submitted: dict[str, int] = {}
        self._round_lock = threading.Lock()
        self._drivers = 0
        # Owned by whichever thread drives the rounds: the pacing state.
        self._last_state: RoundResult = IDLE
        self._backoff = self.cycle_time
        stall_period = settings.stall_check_time_s / _WAITED_ON_PERIODS_PER_STALL_CHECK
        self._waited_on_period = (_IDLE_PERIOD_S if settings.stall_check_disable
                                  else min(_IDLE_PERIOD_S, stall_period))

        self._thread = threading.Thread(target=self._main, name="ringtrain-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ liveness
    def _start_heartbeats(self) -> liveness.Heartbeats | None:
        """Beat to the peers and watch theirs (see engine.liveness); None in a one-rank job."""
        if self.size == 1:
            return None
        world, settings, plane = self.world, self.settings, self.plane

        def peer_address(peer: int) -> str | None:
            # the control plane's connection already reaches that rank: its address works
            return plane.peer_socket(peer).getpeername()[0] if plane is not None else None

        heartbeats = liveness.Heartbeats.start(
            world.store, self.rank, self.size, world.hostname, node_identity(),
            candidate_addresses(world.main_address, settings.gloo_socket_ifname), peer_address,
            settings.peer_timeout_s, settings.gloo_timeout_s, self._peer_failed, secret=world.secret,
            scope=world.scope)
        if plane is not None:
            plane.names = heartbeats.names
            plane.watch_links(settings.peer_timeout_s)
        return heartbeats

    def _stop_heartbeats(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.stop()

    def whoami(self) -> str:
        """``rank N on host H``."""
        return f"rank {self.rank} on host {self.world.hostname}"

    def _peer_failed(self, reason: str) -> None:
        """A peer was declared failed (heartbeat thread): end every wait and fail every handle."""
        with self._cv:
            if self.broken is None:
                self.broken = f"{SHUT_DOWN_MESSAGE} ({self.whoami()}: {reason})"
            message = self.broken
        log.error("%s: %s", self.whoami(), reason)
        self.abort.trigger(reason)
        if self.plane is not None:
            self.plane.abort(reason)
        self.handles.fail_all(message, HorovodInternalError)
        with self._cv:
            self._cv.notify_all()

    def _collective_failed(self, exc: BaseException) -> str:
        """The engine's message for a collective that raised ``exc``, naming the peers that are gone."""
        detail = f"{type(exc).__name__}: {exc}"
        gone = self.plane.gone_peers() if self.plane is not None else []
        if gone and not isinstance(exc, ControlPlaneError):
            names = ", ".join(self.plane.label(peer) for peer in gone) if self.plane is not None else ""
            detail += f" ({names} exited: its connection is closed)"
        return f"{SHUT_DOWN_MESSAGE} ({self.whoami()}: a collective failed: {detail})"

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
            self._note_arrival(meta.names[0] if meta.names else str(number))
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
        self._stop_heartbeats()
        if self.plane is not None:
            self.plane.close()
        if self.groups.arena is not None:
            self.groups.arena.close()
        # a round still running (the join timed out) may hold an NCCL kernel: abort rather than wait on it
        stuck = threading.current_thread() is not self._thread and self._thread.is_alive()
        self.groups.close_device_groups(failed=self.broken is not None or stuck)
        self.handles.fail_all(self.broken or SHUT_DOWN_MESSAGE, HorovodInternalError)
        self.timeline.stop()

    # ---------------------------------------------------------------- thread
    def _main(self) -> None:
        while not self.stopped:
            self._wait_next(self._last_state)
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

    def _step(self) -> RoundResult | None:
        """One round with failure handling; None once the engine has stopped. Hold ``_round_lock``."""
        if self.stopped:
            return None
        try:
            state = self._round()
        except Exception as exc:  # any failure must reach every waiting handle
            with self._cv:
                if self.broken is None:  # the heartbeats may have said why first
                    self.broken = self._collective_failed(exc)
            log.debug("engine failed", exc_info=True)
            state = None
        if state is not None:
            self._last_state = state
        if state is None:
            self.stopped = True
            self._stop_heartbeats()
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
                    self._wait_next(state)
        finally:
            with self._cv:
                self._drivers -= 1
                handle.driving = False
                if self._incoming or self.controller.pending or self._stop_requested:
                    self._cv.notify_all()
        handle.done.wait()

    def _wait_next(self, last: RoundResult) -> None:
        """Pace the next round after ``last``: at once, after a back-off, or after the idle period."""
        with self._cv:
            if self._wake or self._stop_requested:
                return
            if last.progress:
                self._backoff = self.cycle_time
            if last.mine_pending and not last.all_pending:
                # Someone we wait for has nothing pending: block inside the next round (in gloo, no CPU)
                # until that rank submits.
                return
            # With nothing of its own pending, this rank's rounds cannot settle a name that waits for
            # it (its submission wakes it at once); on a machine whose cores all compute, rounds paced
            # every few milliseconds would slow the rank everyone is waiting for.
            if last.mine_pending or last.others_need_rounds:
                timeout = self._backoff
                if not last.progress:
                    self._backoff = min(max(self._backoff * 2, 1e-4), _MAX_BACKOFF_S)
            elif last.others_pending:
                timeout = self._waited_on_period
            else:
                timeout = _IDLE_PERIOD_S
            if timeout > 0:
                self._cv.wait(timeout)

    def _round(self) -> RoundResult | None:
        """One round: the controller decides, this thread executes; None once every rank is leaving."""
        with self._cv:
            new = self._incoming
            self._incoming = []
            self._wake = False
            joining = self._join_handle is not None
            stopping = self._stop_requested
        controller = self.controller
        result = controller.negotiate(new, joining, stopping)
        if result.ready:
            self._execute(result.ready)
            result.ready.clear()  # the result paces the next round: it must not keep tensors alive
        if result.last_joined is not None:
            self._finish_join(result.last_joined)
        if controller.stalled(result.joined):
            with self._cv:
                self._stop_requested = True
                self._stop_reason = (
                    f"{SHUT_DOWN_MESSAGE} (stall: requests waited longer than "
                    f"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS={controller.stall.shutdown_time:g})"
                )
        return None if result.shutdown else result

    def _finish_join(self, last: int) -> None:
        """Every rank has joined: this rank's ``join()`` returns the rank that joined last."""
        with self._cv:
            number, self._join_handle = self._join_handle, None
        if number is not None:
            handle = self.handles.get(number)
            if handle is not None:
                handle.outputs = last
                handle.done.set()

    # ------------------------------------------------------------- execution
    def _execute(self, ready: list[tuple[Response, Request | None]]) -> None:
        """Run the agreed responses in order; consecutive compatible allreduces run fused."""
        runnable: list[tuple[Response, Request | None]] = []
        for response, request in ready:
            if response.error is not None:
                self._complete(request, response.error)
                continue
            if response.op in _CONTROL_OPS:
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
            return self.groups.add_set(list(ref.payload or ()))
        if response.op == OpType.PROCESS_SET_REMOVE:
            set_id = (ref.payload or (0,))[0]
            removed = self.groups.remove_set(set_id)
            if removed:
                self.controller.cache.evict_set(set_id)
            return removed
        return None

    def _note_arrival(self, name: str) -> None:
        """When this rank submitted ``name`` for its n-th time: the launcher's watch pairs these across
        ranks to tell which rank the others wait for (ringtrain.watch.stragglers)."""
        seen = self._submitted.get(name, 0) + 1
        self._submitted[name] = seen
        if len(self._submitted) > _ARRIVAL_NAMES_KEPT:
            self._submitted.pop(next(iter(self._submitted)))
        self.arrivals.append((f"{name}#{seen}", time.time()))

    def _complete(self, request: Request | None, error: str | None) -> None:
        if request is None:
            return
        self.completed += 1  # read by the launcher's watch (ringtrain.watch.probe) as progress
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
