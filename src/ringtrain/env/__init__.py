"""Where am I: one small class per launcher or scheduler, tried in a fixed order.

The order matters where variables overlap: torchrun's variables are the most specific (they are set
per process by the agent, also inside a Slurm allocation), a horovodrun worker comes next, then plain
env://, then schedulers and MPI launchers, and a single process last.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ringtrain.env.base import ClusterEnvironment, EnvironmentError_, Placement
from ringtrain.env.single import SingleProcessEnvironment
from ringtrain.env.torchrun import EnvVarsEnvironment, TorchElasticEnvironment

#: Detection order; the first class whose ``detect`` is true wins.
ENVIRONMENTS: list[type[ClusterEnvironment]] = [
    TorchElasticEnvironment,
    EnvVarsEnvironment,
    SingleProcessEnvironment,
]


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Return the first environment in ``ENVIRONMENTS`` that recognises ``environ``."""
    environ = os.environ if environ is None else environ
    for cls in ENVIRONMENTS:
        if cls.detect(environ):
            return cls(environ)
    return SingleProcessEnvironment(environ)


__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "EnvironmentError_",
    "Placement",
    "detect_environment",
]
