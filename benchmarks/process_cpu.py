"""CPU seconds of the processes around a job, by role, from /proc: what a launcher costs besides its ranks.

Independent of the machine's load: a process's CPU seconds (utime + stime) are what it ran, whoever else
ran meanwhile. A sampler thread lists /proc every ``interval`` seconds, sorts each new process into a role
by its command line (once), and reads the CPU seconds of those it tracks; everything it does not track
(other users' work, the kernel) is the machine's total from /proc/stat less the tracked processes.

The window that counts is the ranks' lifetime (first to last sample that saw a rank): what the other
processes took while the ranks wanted both cores. Linux only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TICK = os.sysconf("SC_CLK_TCK")

#: What a Ray node's bridge (ringtrain.launch.ray.bridge) has on its command line.
BRIDGE = "ringtrain.launch.ray.bridge"
#: Roles, in the order the report lists them.
ROLES = ("ranks", "driver", "agent", "bridge", "actors", "ray daemons", "benchmark", "other")


def role_by_command(command: str, pid: int, driver_pid: int, bench_pid: int) -> str:
    """The role of one of the benchmark's descendants (or itself) from its command line."""
    if pid == bench_pid:
        return "benchmark"  # its ray.init holds Ray's driver-side threads of the local cluster
    if pid == driver_pid:
        return "driver"
    if "ringtrain.launch.worker_entry" in command:
        return "ranks"
    if BRIDGE in command:
        return "bridge"
    if "ringtrain.launch.node_entry" in command:
        return "agent"
    if command.startswith("ray::NodeAgentActor"):
        return "actors"
    # what else descends from the benchmark is its local Ray cluster: raylet, gcs_server, idle workers,
    # the dashboard and runtime-env agents
    return "ray daemons"


def _stat(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds, parent pid, nice) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            fields = fp.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the name: state(0) ppid(1) ... utime(11) stime(12) ... nice(16)
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[1]), int(fields[16])


def _machine_busy() -> float:
    """CPU seconds the whole machine spent not idle (all cores) since boot."""
    with open("/proc/stat") as fp:
        values = [int(v) for v in fp.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    guest = sum(values[8:10]) if len(values) > 9 else 0  # counted in user already
    return (sum(values) - idle - guest) / TICK


def _waited(pid: int) -> float:
    """Seconds ``pid`` has spent runnable but waiting for a CPU (/proc/PID/schedstat); 0 once gone."""
    try:
        with open(f"/proc/{pid}/schedstat") as fp:
            return int(fp.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass
class Tracked:
    role: str
    samples: list[tuple[float, float]] = field(default_factory=list)  # (monotonic time, CPU seconds)
    nice: int = 0
    waited: float = 0.0  # run-queue wait seconds at the last sample (ranks only)


class CpuAccount:
    """Samples while a job runs (``start`` / ``stop``); :meth:`by_role` gives the CPU seconds by role."""

    def __init__(self, driver_pid: int, interval: float = 0.5,
                 classify: Callable[[str, int, int, int], str] = role_by_command) -> None:
        self.driver_pid, self.interval, self.classify = driver_pid, interval, classify
        self.bench_pid = os.getpid()
        self.tracked: dict[int, Tracked] = {}
        self.ignored: set[int] = set()
        self.machine: list[tuple[float, float]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-account", daemon=True)

    def start(self) -> CpuAccount:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._done.wait(self.interval):
                self.sample()
                return

    def sample(self) -> None:
        now = time.monotonic()
        self.machine.append((now, _machine_busy()))
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in self.ignored:
                continue
            pid = int(entry)
            stat = _stat(pid)
            if stat is None:
                continue
            cpu, parent, nice = stat
            item = self.tracked.get(pid)
            if item is None or item.role not in ("ranks", "driver", "benchmark"):
                # asked again: Ray names a worker by what it runs now (an idle one becomes an actor), and
                # a child seen between fork and exec still shows its parent's command line
                role = self._role_of(pid, parent)
                if role is None:
                    self.ignored.add(pid)
                    continue
                if item is None:
                    item = self.tracked[pid] = Tracked(role)
                item.role = role
            item.samples.append((now, cpu))
            item.nice = nice
            if item.role == "ranks":
                item.waited = _waited(pid) or item.waited

    def _role_of(self, pid: int, parent: int) -> str | None:
        """A new process's role; only this benchmark's own descendants count (other people's Ray
        clusters and ranks on the same machine are "other")."""
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fp:
                command = fp.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        # a Ray node's bridge detaches from the actor that started it (its parent is init then): it and
        # what runs under it (the agent, the ranks) are the job's all the same
        if pid != self.bench_pid and not self._descends(parent) and BRIDGE not in command:
            return None
        return self.classify(command, pid, self.driver_pid, self.bench_pid)

    def _descends(self, pid: int) -> bool:
        for _ in range(32):
            if pid == self.bench_pid or pid in self.tracked:
                return True
            if pid <= 1:
                return False
            stat = _stat(pid)
            if stat is None:
                return False
            pid = stat[1]
        return False

    def window(self) -> tuple[float, float]:
        """First and last sample time that saw a rank (the whole sampling when none was seen)."""
        times = [t for item in self.tracked.values() if item.role == "ranks" for t, _ in item.samples]
        if not times:
            return self.machine[0][0], self.machine[-1][0]
        return min(times), max(times)

    def by_role(self) -> dict[str, float]:
        """CPU seconds each role ran within :meth:`window`; "other": the machine's busy seconds less them."""
        low, high = self.window()
        totals = dict.fromkeys(ROLES, 0.0)
        for item in self.tracked.values():
            inside = [cpu for t, cpu in item.samples if low <= t <= high]
            before = [cpu for t, cpu in item.samples if t < low]
            if inside:
                # a process seen before the window counts from its last sample before it; a new one from 0
                totals[item.role] += inside[-1] - (before[-1] if before else 0.0)
        machine = [busy for t, busy in self.machine if low <= t <= high]
        if len(machine) >= 2:
            totals["other"] = max(machine[-1] - machine[0] - sum(totals.values()), 0.0)
        return totals

    def rank_wait(self) -> float:
        """Seconds the ranks (all together) were runnable but waited for a CPU, over their lives: what
        the other processes cost them, whatever their own CPU seconds."""
        return sum(item.waited for item in self.tracked.values() if item.role == "ranks")

    def rank_nice(self) -> list[int]:
        """The niceness of every rank process seen."""
        return sorted({item.nice for item in self.tracked.values() if item.role == "ranks"})
