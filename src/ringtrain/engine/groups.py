"""The engine's groups: the gloo control group, the control plane, and every process set's data groups.

All of them are built from the job's store (:mod:`ringtrain.engine.world_rendezvous`), in the same
order on every rank: at ``init()`` the control group, the socket mesh and the sets known then; a set
added later gets its groups at the same point of the agreed order everywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ringtrain.engine import control_plane, hierarchical, liveness
from ringtrain.engine.executor import SetGroups
from ringtrain.engine.netutil import interface_address
from ringtrain.engine.settings import Settings
from ringtrain.engine.shared_arena import SharedArena
from ringtrain.engine.world_rendezvous import World, make_gloo_group, make_nccl_group

log = logging.getLogger(__name__)


class EngineGroups:
    """What one engine communicates over; ``sets`` maps process set ids to their data groups."""

    def __init__(self, world: World, settings: Settings, abort: liveness.Abort | None = None) -> None:
        self.world, self.settings = world, settings
        self.rank, self.size = world.rank, world.size
        #: Set when a peer is declared failed: every wait on these groups ends (see engine.liveness).
        self.abort = abort or liveness.Abort()
        # A round may legitimately wait very long for a slow rank (evaluation, checkpointing); a dead,
        # hung or unreachable peer is detected by its connection or its heartbeats, not by this timeout.
        round_timeout = settings.round_timeout_s
        mode = self._agree("ctrl/mode", self._mode) if self.size > 1 else "gloo"
        # The control group carries the rounds only where they do not go over the socket mesh; there
        # it needs the round timeout. Otherwise it runs data collectives of the global set, which wait
        # at most HOROVOD_GLOO_TIMEOUT_SECONDS for a peer, as gloo operations do in Horovod.
        ctrl_timeout = settings.gloo_timeout_s if mode == "tcp" else round_timeout
        ctrl = make_gloo_group(
            world, "control", list(range(self.size)), ctrl_timeout, settings.gloo_socket_ifname,
            setup_timeout_s=settings.gloo_timeout_s,
        )
        assert ctrl is not None, "every rank is a member of the control group"
        self.ctrl = ctrl
        self.plane = self._connect_plane(mode, round_timeout)
        large = self._agree("ctrl/cpu_allreduce", lambda: settings.cpu_allreduce) if self.plane else "gloo"
        #: CPU allreduces too large for the mesh run as a ring over the plane (else on gloo).
        self.cpu_ring = large in ("auto", "ring")
        #: Which host every rank is on, and whether the hierarchical collectives are on (rank 0 decides).
        self.topology = hierarchical.Topology.discover(world, self.ctrl, self._agree, settings)
        #: Shared memory for the large CPU allreduces of sets of every rank, when all are on one host.
        self.arena: SharedArena | None = None
        if large == "auto" and len(set(self.topology.hosts)) == 1:
            self.arena = SharedArena(self.plane, settings.fusion_threshold_bytes)
        self.sets: dict[int, SetGroups] = {}
        self._fusion_buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._next_set_id = 0

    def add_set(self, ranks: list[int]) -> int:
        """Register a process set locally and build its data group (members only); returns its id."""
        set_id = self._next_set_id
        self._next_set_id += 1
        tag = f"set{set_id}"
        world, timeout = self.world, self.settings.gloo_timeout_s
        gloo = None
        if set_id == 0:
            # The global set's data runs on the control group: the same thread issues both, in the
            # agreed order, and staying on one group keeps gloo's worker threads warm.
            gloo = self.ctrl
        elif self.rank in ranks:
            gloo = make_gloo_group(world, tag, ranks, timeout, self.settings.gloo_socket_ifname)
        groups = SetGroups(
            set_id=set_id,
            ranks=list(ranks),
            gloo=gloo,
            make_nccl=lambda: make_nccl_group(world, tag, list(ranks), timeout),
            # CPU allreduces may travel over the control plane's sockets (see executor.run_allreduce).
            plane=self.plane,
            ring=self.cpu_ring,
            shm=self.arena if sorted(ranks) == list(range(self.size)) else None,
            buffers=self._fusion_buffers,
            keep_bytes=self.settings.fusion_threshold_bytes,
            abort=self.abort,
        )
        if self.rank in ranks:
            groups.extra["set_rank"] = ranks.index(self.rank)
            groups.extra["hierarchy"] = hierarchical.Hierarchy(self.topology, world, groups, self.settings)
        self.sets[set_id] = groups
        return set_id

    def remove_set(self, set_id: int) -> bool:
        """Forget a process set (never the global one); False when there is no such set."""
        if set_id in self.sets and set_id != 0:
            del self.sets[set_id]
            return True
        return False

    def close_device_groups(self, failed: bool) -> None:
        """End the NCCL groups the sets built: shut down after a clean stop, abort after a failure.

        Dropped without either, torch's ProcessGroupNCCL warns at exit that destroy_process_group() was
        not called (seen on an H200: benchmarks/results/gpu/). A failed job aborts, which never waits on
        a peer that may be gone.
        """
        for groups in self.sets.values():
            nccl, groups.nccl = groups.nccl, None
            if nccl is None:
                continue
            end = getattr(nccl, "abort" if failed else "shutdown", None)
            if end is None:
                continue
            try:
                end()
            except Exception:  # the job is ending either way; the group's error is not its cause
                log.debug("closing the NCCL group of set %d failed", groups.set_id, exc_info=True)

    def is_homogeneous(self) -> bool:
        """Whether every host runs the same number of ranks (a collective over the control group)."""
        mine = torch.tensor([self.world.local_size], dtype=torch.int64)
        if self.size == 1:
            return True
        out = [torch.empty(1, dtype=torch.int64) for _ in range(self.size)]
        # torch's stubs give Backend (ProcessGroupGloo's base) none of the collectives it has
        gathered = self.ctrl.allgather([out], [mine])  # type: ignore[attr-defined]
        liveness.wait_on_group(gathered, self.ctrl, self.abort)
        return len({int(t.item()) for t in out}) == 1

    def _mode(self) -> str:
        """What carries the rounds: ``tcp`` (the socket mesh) or ``gloo`` (rank 0 decides for the job)."""
        return "gloo" if self.size > control_plane.DEFAULT_MAX_RANKS else self.settings.control_plane

    def _connect_plane(self, mode: str, round_timeout: float) -> control_plane.ControlPlane | None:
        """The socket mesh for rounds, or None where rounds go through gloo."""
        if self.size == 1 or mode != "tcp":
            return None
        store = self.world.store
        return control_plane.ControlPlane.connect(
            store,
            self.rank,
            self.size,
            self.world.main_address,
            timeout_s=self.settings.gloo_timeout_s,
            round_timeout_s=round_timeout,
            interfaces=self.settings.gloo_socket_ifname,
            secret=self.world.secret,
            bind_host=self._listen_address(),
            scope=self.world.scope,
            handshake_timeout_s=self.settings.handshake_timeout_s,
        )

    def _listen_address(self) -> str | None:
        """Where the control plane listens: loopback for a one-host job, else the interface named by
        GLOO_SOCKET_IFNAME, else (None) every interface."""
        if self.world.single_host:
            return "127.0.0.1"
        for name in self.settings.gloo_socket_ifname:
            address = interface_address(name)
            if address:
                return address
        return None

    def _agree(self, key: str, choose: Callable[[], str]) -> str:
        """A setting every rank must share: rank 0's choice, published through the store."""
        if self.rank == 0:
            self.world.store.set(key, choose())
        return self.world.store.get(key).decode()
