"""The ranks of ``ringtrain run``: torchrun's variables (its agent is torch's) plus ``RINGTRAIN_ATTEMPT``.

Told apart from torchrun so that ``ringtrain check`` and ``ringtrain env`` say which launcher started
the ranks; everything else is read exactly as torchrun's.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.torchrun import TorchElasticEnvironment

#: Set by ``ringtrain run``'s agent for every rank (the rendezvous round); torchrun never sets it.
ATTEMPT_VARIABLE = "RINGTRAIN_ATTEMPT"


class RingtrainRunEnvironment(TorchElasticEnvironment):
    """Processes started by ``ringtrain run``."""

    name = "ringtrain-run"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return super().detect(environ) and ATTEMPT_VARIABLE in environ

    def source_variables(self) -> dict[str, str]:
        return {**super().source_variables(), ATTEMPT_VARIABLE: self.environ[ATTEMPT_VARIABLE]}
