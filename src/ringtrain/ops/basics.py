"""Lifecycle and queries: init/shutdown, ranks and sizes, build flags, the timeline, and the two
synchronization points that carry no data (barrier, join)."""

from __future__ import annotations

import atexit
import sys
from typing import Any

import torch

from ringtrain.engine import elastic_rendezvous, state
from ringtrain.engine.background import Engine
from ringtrain.engine.requests import OpType
from ringtrain.engine.settings import Settings
from ringtrain.engine.world_rendezvous import rendezvous
from ringtrain.env.allocator import tune_allocator
from ringtrain.env.binding import bind_rank
from ringtrain.exceptions import ElasticWorkerExit, SettingError
from ringtrain.op_requests import control_op, synchronize
from ringtrain.process_sets import ProcessSet, global_process_set, register_static

_atexit_registered = False


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start the engine (rendezvous, control and data groups, background thread).

    A second call while initialized does nothing. ``process_sets`` may be a list of
    :class:`ProcessSet` (registered statically, same list on all ranks) or ``"dynamic"``. The
    ``HOROVOD_*`` / ``RINGTRAIN_*`` variables are read here, once (see docs/settings.md).
    """
    global _atexit_registered
    if state.engine is not None and not state.engine.stopped:
        return
    if state.engine is not None:
        shutdown()
    if comm is not None:
        if isinstance(comm, (list, tuple, range)):
            # A sub-world would need its own rendezvous; Horovod's gloo path does not offer it either.
            raise NotImplementedError(
                f"init(comm={list(comm)!r}): running Horovod on a subset of the launched ranks is not "
                "supported. HINT: launch only the ranks you need, or use process_sets=[hvd.ProcessSet(...)]."
            )
        raise ValueError(
            "init(comm=<mpi4py communicator>) needs an MPI build of Horovod; ringtrain has none. "
            "HINT: call hvd.init() without comm."
        )
    static: list[ProcessSet] = []
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(f"init(process_sets={process_sets!r}): the only string accepted is 'dynamic'.")
        state.dynamic_sets = True
    elif process_sets is not None:
        static = list(process_sets)
    settings = Settings.from_environ()
    tune_allocator(settings.malloc)
    bind_rank(settings.bind)
    try:
        world, engine = _start_engine(settings, static)
    except (ValueError, ElasticWorkerExit):
        raise
    except Exception as exc:
        raise ValueError(f"Horovod initialization failed: {type(exc).__name__}: {exc}") from exc
    state.engine = engine
    global_process_set.ranks = list(range(world.size))
    global_process_set.process_set_id = 0
    state.registered = {0: global_process_set}
    for set_id, ps in enumerate(static, start=1):
        ps.process_set_id = set_id
        state.registered[set_id] = ps
    timeline = settings.timeline
    if timeline and timeline != "DYNAMIC" and world.rank == 0:
        try:
            engine.timeline.start(timeline, settings.timeline_mark_cycles)
        except OSError as exc:
            raise SettingError(
                f"HOROVOD_TIMELINE={timeline!r}: rank 0 cannot write the timeline there ({exc.strerror}). "
                "HINT: name a file in an existing, writable folder, or unset HOROVOD_TIMELINE."
            ) from exc
    if not _atexit_registered:
        atexit.register(_shutdown_at_exit)
        _atexit_registered = True


def _start_engine(settings: Settings, static: list[ProcessSet]) -> tuple[Any, Engine]:
    """Rendezvous and build the engine's groups.

    An elastic worker whose generation breaks while forming (a peer died, the driver abandoned it)
    leaves it and joins the next one the driver publishes; anything else is raised.
    """
    while True:
        if elastic_rendezvous.enabled():
            # Started by ringtrain's elastic driver: rank, size and the key namespace come from the
            # driver's current generation, not from RANK / WORLD_SIZE variables.
            world = elastic_rendezvous.join(settings.gloo_timeout_s)
        else:
            world = rendezvous(settings.gloo_timeout_s, settings.gloo_socket_ifname,
                               settings.handshake_timeout_s)
        try:
            register_static(static, world.size)
            return world, Engine(world, settings, [ps.ranks for ps in static])
        except ValueError:
            raise
        except Exception as exc:
            if not elastic_rendezvous.enabled():
                raise
            print(f"ringtrain elastic: the group of {world.size} could not form ({type(exc).__name__}: "
                  f"{exc}); waiting for the driver's next generation", file=sys.stderr, flush=True)


def shutdown() -> None:
    """Stop the engine; afterwards ``init()`` may be called again (auto names restart at 0)."""
    engine = state.engine
    if engine is None:
        return
    state.engine = None
    engine.stop()
    for set_id, ps in list(state.registered.items()):
        if set_id != 0:
            ps.process_set_id = None
    state.registered = {}


def _shutdown_at_exit() -> None:
    engine = state.engine
    if engine is not None:
        state.engine = None
        engine.stop(timeout=10.0)


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return state.engine is not None


def size() -> int:
    """Number of ranks in the job."""
    return state.require().size


def local_size() -> int:
    """Number of ranks on this host."""
    return state.require().world.local_size


def cross_size() -> int:
    """Number of hosts that run this process's local rank."""
    return state.require().world.cross_size


def rank() -> int:
    """This process's global rank."""
    return state.require().rank


def local_rank() -> int:
    """This process's index on its host."""
    return state.require().world.local_rank


def cross_rank() -> int:
    """Index of this host among hosts that run this local rank."""
    return state.require().world.cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return state.require().homogeneous


def mpi_threads_supported() -> bool:
    """False: ringtrain never runs on MPI, so mixing it with another MPI library's threads is not supported.

    Horovod without MPI raises ValueError here; a script asking before it uses mpi4py gets a plain
    answer instead (before ``init()`` too).
    """
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return True


def gloo_built() -> bool:
    return True


def nccl_built() -> int:
    """NCCL version code (e.g. 21903 for 2.19.3), or 0 without CUDA/NCCL."""
    try:
        if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
            return 0
        version = torch.cuda.nccl.version()
    except Exception:  # any failure means "not usable"
        return 0
    if isinstance(version, tuple):
        major, minor, patch = (list(version) + [0, 0, 0])[:3]
        return (
            major * 10000 + minor * 100 + patch
            if (major, minor) >= (2, 9)
            else major * 1000 + minor * 100 + patch
        )
    return int(version)


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return torch.version.cuda is not None


def rocm_built() -> bool:
    return getattr(torch.version, "hip", None) is not None


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a Chrome-trace timeline (rank 0); needs HOROVOD_TIMELINE set at init."""
    engine = state.require()
    if engine.settings.timeline is None:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    if engine.rank == 0:
        engine.timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop and close the timeline file."""
    engine = state.require()
    if engine.settings.timeline is None:
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    engine.timeline.stop()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every member of the set has called barrier."""
    control_op(OpType.BARRIER, "barrier", None, process_set)


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; wait for all ranks; return the last rank to join.

    While joined, this rank takes part in other ranks' allreduces with zeros. ``device`` is accepted
    for compatibility (zeros are made on the device of the data being reduced).
    """
    engine = state.require()
    return synchronize(engine.join())
