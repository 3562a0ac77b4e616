"""torchrun / torch.distributed.elastic, and plain env:// (RANK and WORLD_SIZE set by hand or a platform).

Plain env:// also covers launchers that set torch's names plus a few of their own: DeepSpeed's
``LOCAL_SIZE`` and ``CROSS_RANK`` / ``CROSS_SIZE`` (node index and count), Lightning's ``NODE_RANK``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import ClusterEnvironment, read_int
from ringtrain.exceptions import ClusterEnvironmentError

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "NODE_RANK", "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_RUN_ID")
#: Where each value may come from, most specific first.
_LOCAL_SIZE = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")
_NODE_RANK = ("GROUP_RANK", "NODE_RANK", "CROSS_RANK")
_NUM_NODES = ("GROUP_WORLD_SIZE", "CROSS_SIZE")


class EnvVarsEnvironment(ClusterEnvironment):
    """Plain env://: RANK and WORLD_SIZE without an elastic agent."""

    name = "env"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "RANK" in environ and "WORLD_SIZE" in environ

    def world_size(self) -> int:
        return read_int(self.environ, "WORLD_SIZE")

    def global_rank(self) -> int:
        return read_int(self.environ, "RANK")

    def local_rank(self) -> int:
        return read_int(self.environ, "LOCAL_RANK", 0)

    def local_world_size(self) -> int:
        for name in _LOCAL_SIZE:
            if name in self.environ:
                return read_int(self.environ, name)
        return 1 if "LOCAL_RANK" not in self.environ else self.world_size()

    def node_rank(self) -> int:
        for name in _NODE_RANK:
            if name in self.environ:
                return read_int(self.environ, name)
        return super().node_rank()

    def node_rank_is_derived(self) -> bool:
        return not any(name in self.environ for name in _NODE_RANK)

    def num_nodes(self) -> int:
        for name in _NUM_NODES:
            if name in self.environ:
                return read_int(self.environ, name)
        return super().num_nodes()

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _TORCH_VARS if k in self.environ}

    def validate(self) -> list[str]:
        warnings = super().validate()
        if "MASTER_ADDR" not in self.environ and not self._single_node_or_unknown():
            warnings.append(f"{self.name}: the job spans several nodes but MASTER_ADDR is not set, so "
                            "127.0.0.1 is used and the other nodes cannot reach rank 0. "
                            "HINT: export MASTER_ADDR=<host of rank 0> (and MASTER_PORT) on every node.")
        slurm_tasks = _slurm_step_tasks(self.environ)
        try:
            size = self.world_size()
        except ClusterEnvironmentError:
            return warnings
        if slurm_tasks > 1 and size < slurm_tasks:
            warnings.append(f"{self.name}: WORLD_SIZE={size} is smaller than the {slurm_tasks} tasks of this "
                            "Slurm step, so several tasks started separate jobs that share one MASTER_PORT. "
                            "HINT: set WORLD_SIZE to cover every task, or run one launcher per node "
                            "(srun --ntasks-per-node=1 ringtrain run --nproc-per-node N ...).")
        return warnings

    def _single_node_or_unknown(self) -> bool:
        try:
            return self.num_nodes() <= 1 or self.is_single_node()
        except ClusterEnvironmentError:
            return True


class TorchElasticEnvironment(EnvVarsEnvironment):
    """Processes started by torchrun's elastic agent (``ringtrain run`` uses the same agent)."""

    name = "torchrun"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in environ and "RANK" in environ

    def validate(self) -> list[str]:
        warnings = ClusterEnvironment.validate(self)
        slurm_tasks = _slurm_step_tasks(self.environ)
        if slurm_tasks > 1 and "GROUP_WORLD_SIZE" in self.environ:
            try:
                agents = self.num_nodes()
            except ClusterEnvironmentError:
                return warnings
            if agents < slurm_tasks:
                warnings.append(
                    f"{self.name}: {agents} agent(s) (GROUP_WORLD_SIZE, --nnodes) but this Slurm step runs "
                    f"{slurm_tasks} tasks, each starting its own agent: they form separate jobs on one port. "
                    f"HINT: use --nnodes={slurm_tasks} with one shared rendezvous, or one task per node.")
        return warnings


def _slurm_step_tasks(environ: Mapping[str, str]) -> int:
    """Tasks of the enclosing ``srun`` step (0 outside one, or when unreadable)."""
    if "SLURM_STEP_ID" not in environ and "SLURM_STEPID" not in environ:
        return 0
    value = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "0"
    return int(value) if value.strip().isdigit() else 0
