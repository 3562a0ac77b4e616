"""No launcher at all: ``python train.py`` is one process of a world of one."""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import ClusterEnvironment


class SingleProcessEnvironment(ClusterEnvironment):
    """The fallback: rank 0 of 1."""

    name = "single"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Always true; tried last."""
        return True

    def world_size(self) -> int:
        return 1

    def global_rank(self) -> int:
        return 0

    def local_rank(self) -> int:
        return 0

    def local_world_size(self) -> int:
        return 1

    def default_main_port(self) -> int:
        """0: nobody else needs to find this process, so the engine may take any free port."""
        return 0
