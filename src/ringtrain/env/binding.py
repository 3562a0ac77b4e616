"""Binding each rank of a host to cores of its own (``RINGTRAIN_BIND=core``), as ``mpirun --bind-to core``.

Unbound, the kernel moves a rank's threads between cores as it balances load: caches go cold, and a
rank's helper threads (the engine's, gloo's, the data loader's) land on the core where another rank
computes. Bound, rank ``r`` of ``n`` on a host runs on the ``r``-th of ``n`` equal shares of the
physical cores its process may use (every hardware thread of those cores), or, with more ranks
than physical cores, on hardware threads of its own. Threads and processes a rank starts inherit
its share.

Nothing is changed (the answer says why) where the process may already use fewer CPUs than the host
has online (Slurm's ``--cpu-bind``, ``mpirun --bind-to``, ``taskset`` or ``numactl``: the user's or the
scheduler's binding stands), where the host holds more ranks than hardware threads, or where the OS
has no affinity call. ``none`` (the default) leaves the kernel to place threads: with data loader
workers or GPUs, a share of the cores may be too small.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger("ringtrain")

#: What :func:`bind_rank` did in this process ("none", "cores 0-1", "none (why)"); None before.
_state: str | None = None


def physical_cores(cpus: Sequence[int], sys_cpu: Path = Path("/sys/devices/system/cpu")) -> list[list[int]]:
    """``cpus`` grouped by physical core (hardware-thread siblings together), in order of first CPU.

    A CPU whose topology cannot be read counts as a core of its own.
    """
    allowed = set(cpus)
    cores: dict[tuple[int, ...], list[int]] = {}
    for cpu in sorted(allowed):
        try:
            siblings = tuple(sorted(parse_cpu_list((sys_cpu / f"cpu{cpu}/topology/thread_siblings_list")
                                                   .read_text()) & allowed))
        except (OSError, ValueError):
            siblings = (cpu,)
        cores.setdefault(siblings or (cpu,), []).append(cpu)
    return sorted((sorted(group) for group in cores.values()), key=lambda group: group[0])


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format (``0-3,8,10-11``) as a set; ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"CPU range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return cpus


def format_cpu_list(cpus: Sequence[int]) -> str:
    """The inverse of :func:`parse_cpu_list`, ranges collapsed: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive CPUs
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def share_of(local_rank: int, local_size: int, cores: list[list[int]]) -> list[int] | None:
    """The CPUs of rank ``local_rank`` of ``local_size`` on ``cores``; None when they do not go round.

    Whole physical cores when there are at least as many as ranks (the first ``len % size`` ranks get
    one more), else single hardware threads, else None.
    """
    if not 0 <= local_rank < local_size:
        raise ValueError(f"local rank {local_rank} is not in 0..{local_size - 1}")
    if local_size <= len(cores):
        base, extra = divmod(len(cores), local_size)
        start = local_rank * base + min(local_rank, extra)
        mine = cores[start:start + base + (1 if local_rank < extra else 0)]
        return [cpu for core in mine for cpu in core]
    # Spread over cores first: rank k takes the k-th thread counting across cores, not within one.
    by_sibling = [core[i] for i in range(max(map(len, cores), default=0)) for core in cores if i < len(core)]
    return [by_sibling[local_rank]] if local_size <= len(by_sibling) else None


def bind_rank(setting: str, environ: Mapping[str, str] | None = None) -> str:
    """Apply ``RINGTRAIN_BIND`` (``core`` or ``none``) to this process once; returns what holds.

    The local rank and the number of ranks on this host come from the launcher's variables
    (:func:`ringtrain.env.detect_environment`). The answer is ``"none"``, ``"cores 0-1"`` (the CPUs
    bound to) or ``"none (<why not bound>)"``; later calls return the first answer.
    """
    global _state
    if _state is not None:
        return _state
    if setting != "core":
        _state = "none"
        return _state
    from ringtrain.env import detect_environment
    from ringtrain.exceptions import ClusterEnvironmentError

    try:
        where = detect_environment(environ)
        local_rank, local_size = where.local_rank(), where.local_world_size()
    except (ClusterEnvironmentError, ValueError) as exc:
        _state = f"none (this rank's place on its host is unknown: {exc})"
    else:
        _state = _bind(local_rank, local_size, os.cpu_count())
    if _state.startswith("none ("):
        log.warning("RINGTRAIN_BIND=core: %s", _state)
    return _state


def _bind(local_rank: int, local_size: int, online: int | None) -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "none (this OS has no CPU affinity call)"
    allowed = sorted(os.sched_getaffinity(0))
    if online and len(allowed) < online:
        return (f"none (already bound to CPUs {format_cpu_list(allowed)} of {online}, by the scheduler, "
                "the launcher or the user)")
    mine = share_of(local_rank, local_size, physical_cores(allowed))
    if mine is None:
        return f"none ({local_size} ranks on this host share {len(allowed)} hardware threads)"
    # Every thread there is now (torch's pools may have started): a new one inherits its creator's mask.
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, mine)
        except ProcessLookupError:
            pass  # a thread that ended meanwhile
    return f"cores {format_cpu_list(mine)}"


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: this thread alone


def binding_state() -> str | None:
    """What :func:`bind_rank` did in this process (None: not asked yet)."""
    return _state
