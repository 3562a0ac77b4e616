"""PBS Pro / OpenPBS / Torque: hosts and slots from ``PBS_NODEFILE``.

PBS itself numbers no processes: ranks come from the MPI launcher run inside the job (detected
earlier), from ``ringtrain run --hostfile $PBS_NODEFILE``, or from ``pbsdsh``, which starts one task
per line of the node file with ``PBS_VNODENUM`` = the line's index. Torque numbers the job script
itself task 1 (``PBS_TASKNUM=1``) and ``pbsdsh`` tasks from 2, so a process with ``PBS_TASKNUM`` > 1
is a ``pbsdsh`` task:

- rank = ``PBS_VNODENUM``, world size = number of lines of the node file;
- local rank = earlier lines naming the same host, local world size = lines naming it;
- node rank = index of the host among the distinct hosts, in order of first appearance;
- main address = the first line, port = 15000 + the last four digits of ``PBS_JOBID``.

Any other process of a PBS job is the job script: one process, like Slurm's batch shell, and
``validate()`` warns when the job holds more slots than that.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ringtrain.env.base import LOOPBACK, ClusterEnvironment, port_from_job_id, read_int
from ringtrain.exceptions import ClusterEnvironmentError

_VARS = ("PBS_JOBID", "PBS_NODEFILE", "PBS_TASKNUM", "PBS_VNODENUM", "PBS_NODENUM", "PBS_NUM_NODES",
         "PBS_NUM_PPN", "PBS_NP", "PBS_O_WORKDIR", "PBS_ENVIRONMENT", "MASTER_ADDR", "MASTER_PORT")


def nodefile_lines(path: str | Path) -> list[str]:
    """One host per slot, in file order; a ``host slots=N`` or ``host:N`` line counts N times."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ClusterEnvironmentError(f"cannot read the node file {str(path)!r}: {exc.strerror}. HINT: run "
                                "inside the job (PBS_NODEFILE is only valid there) or pass an existing "
                                "host file.") from None
    lines: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, slots = line.split()[0], 1
        words = line.split()[1:]
        if ":" in host:
            host, _, count = host.partition(":")
            words = [f"slots={count}", *words]
        if not host or "=" in host:  # 'slots=4' or ':4' alone: the host name is missing, not 'slots=4'
            raise ClusterEnvironmentError(f"{path}:{number}: {raw.strip()!r} names no host. HINT: start the "
                                          "line with the host, e.g. node1 slots=4.")
        for word in words:
            if word.startswith("slots="):
                value = word.partition("=")[2]
                if not value.isdigit() or int(value) < 1:
                    raise ClusterEnvironmentError(f"{path}:{number}: {raw.strip()!r} has slots={value!r}. "
                                            "HINT: write a positive whole number, e.g. node1 slots=4.")
                slots = int(value)
        lines.extend([host] * slots)
    return lines


def hosts_from_nodefile(path: str | Path) -> list[tuple[str, int]]:
    """``[(host, slots), ...]`` in order of first appearance: repeated lines add slots to their host.

    Reads PBS/Torque node files (one line per slot), and host files with ``host slots=N`` or
    ``host:N`` lines. Blank lines and ``#`` comments are skipped.
    """
    counts: dict[str, int] = {}
    for host in nodefile_lines(path):
        counts[host] = counts.get(host, 0) + 1
    return list(counts.items())


class PbsEnvironment(ClusterEnvironment):
    """A process of a PBS job: a ``pbsdsh`` task, or the job script itself."""

    name = "pbs"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """``PBS_JOBID`` is set (every process of a PBS job has it)."""
        return bool(environ.get("PBS_JOBID"))

    @property
    def is_task(self) -> bool:
        """Started by ``pbsdsh`` (``PBS_TASKNUM`` > 1 with a ``PBS_VNODENUM``), not the job script."""
        return "PBS_VNODENUM" in self.environ and read_int(self.environ, "PBS_TASKNUM", 1) > 1

    @property
    def host_file_variable(self) -> str | None:
        """``PBS_NODEFILE`` when the job has a node file, else None."""
        return "PBS_NODEFILE" if self.environ.get("PBS_NODEFILE") else None

    def slots(self) -> list[str]:
        """One host per slot of the node file (empty without ``PBS_NODEFILE``)."""
        path = self.environ.get("PBS_NODEFILE", "")
        return nodefile_lines(path) if path else []

    def hosts(self) -> list[tuple[str, int]]:
        """The job's hosts and slots, from ``PBS_NODEFILE``."""
        path = self.environ.get("PBS_NODEFILE", "")
        return hosts_from_nodefile(path) if path else []

    @property
    def script_without_launcher(self) -> bool:
        """The job holds several slots but this is the job script alone."""
        return not self.is_task and len(self.slots()) > 1

    def _my_slot(self) -> int:
        slot = read_int(self.environ, "PBS_VNODENUM")
        if not 0 <= slot < len(self.slots()):
            raise ClusterEnvironmentError(f"pbs: PBS_VNODENUM={slot} is not a line of the node file "
                                    f"({len(self.slots())} lines). HINT: unset stale PBS_* variables.")
        return slot

    def world_size(self) -> int:
        return len(self.slots()) if self.is_task else 1

    def global_rank(self) -> int:
        return self._my_slot() if self.is_task else 0

    def local_rank(self) -> int:
        if not self.is_task:
            return 0
        slots, mine = self.slots(), self._my_slot()
        return slots[:mine].count(slots[mine])

    def local_world_size(self) -> int:
        if not self.is_task:
            return 1
        slots = self.slots()
        return slots.count(slots[self._my_slot()])

    def node_rank(self) -> int:
        if not self.is_task:
            return 0
        return [h for h, _ in self.hosts()].index(self.slots()[self._my_slot()])

    def node_rank_is_derived(self) -> bool:
        return False

    def num_nodes(self) -> int:
        return len(self.hosts()) if self.is_task else 1

    def hostname(self) -> str:
        return self.slots()[self._my_slot()] if self.is_task else super().hostname()

    def default_main_address(self) -> str:
        if self.is_task and self.num_nodes() > 1:
            return self.slots()[0]
        return LOOPBACK

    def default_main_port(self) -> int:
        return port_from_job_id(self.environ.get("PBS_JOBID", ""))

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _VARS if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        try:
            alone = self.script_without_launcher
            slots = len(self.slots())
        except ClusterEnvironmentError as exc:
            return [*warnings, str(exc)]
        if alone:
            warnings.append(f"pbs: the job holds {slots} slots but this is the job script, one process "
                            "(world size 1). HINT: start the ranks with `ringtrain run --hostfile "
                            "$PBS_NODEFILE ...` or mpiexec (see `ringtrain script pbs`).")
        return warnings
