"""The tasks of one ``srun`` step, inside a Slurm batch job: one agent per node.

srun itself is the child process here. It relays its tasks' output (on our streams), forwards
signals, and Slurm watches the nodes' liveness, so this place neither pipes nor beats: a Ctrl-C at a
terminal reaches srun as it reaches us, and :meth:`SrunStep.stop` passes one on (srun stops its
tasks; two within a second cancel the step).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import ClassVar

from ringtrain.launch.supervision import ProcessGroup, Reach


def srun_command(nnodes: int, argv: list[str]) -> list[str]:
    """One task per node on ``nnodes`` nodes, each running ``argv``; a task that fails ends the step."""
    return ["srun", f"--nodes={nnodes}", f"--ntasks={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            *argv]


class SrunStep(ProcessGroup):
    """An srun step: ``argv`` is the whole command line (:func:`srun_command`)."""

    kind: ClassVar[str] = "srun"
    piped: ClassVar[bool] = False
    own_session: ClassVar[bool] = False

    def command(self, argv: list[str], env: Mapping[str, str] | None,
                reach: Reach) -> tuple[list[str], dict[str, str] | None]:
        return argv, None if env is None else dict(env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def forward_signal(self, signum: int) -> bool:
        """srun passes the signals it gets on to its tasks (the node agents, which pass them to their
        ranks)."""
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(signum)
        return True

    def kill_ranks(self) -> None:
        self.stop()  # srun takes a second SIGINT within a second as "cancel the step"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
