"""torchrun / torch.distributed.elastic, and plain env:// (RANK and WORLD_SIZE set by hand or a platform)."""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import ClusterEnvironment, read_int

_TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


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
        return read_int(self.environ, "LOCAL_WORLD_SIZE", 1 if "LOCAL_RANK" not in self.environ
                        else self.world_size())

    def node_rank(self) -> int:
        for name in ("GROUP_RANK", "NODE_RANK"):
            if name in self.environ:
                return read_int(self.environ, name)
        return super().node_rank()

    def num_nodes(self) -> int:
        if "GROUP_WORLD_SIZE" in self.environ:
            return read_int(self.environ, "GROUP_WORLD_SIZE")
        return super().num_nodes()

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _TORCH_VARS if k in self.environ}


class TorchElasticEnvironment(EnvVarsEnvironment):
    """Processes started by torchrun's elastic agent (``ringtrain run`` uses the same agent)."""

    name = "torchrun"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return "TORCHELASTIC_RUN_ID" in environ and "RANK" in environ
