"""No launcher at all: ``python train.py`` is one process of a world of one."""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import OneProcessEnvironment


class SingleProcessEnvironment(OneProcessEnvironment):
    """The fallback: rank 0 of 1."""

    name = "single"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Always true; tried last."""
        return True

    def default_main_port(self) -> int:
        """0: nobody else needs to find this process, so the engine may take any free port."""
        return 0
