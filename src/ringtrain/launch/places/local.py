"""A group of ranks on this machine: a child process started directly (a host's agent, which runs
torch's elastic agent, or an elastic worker)."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import ClassVar

from ringtrain.launch.supervision import ProcessGroup, Reach


class LocalGroup(ProcessGroup):
    """``argv`` run here with ``env`` (None: this process's environment)."""

    kind: ClassVar[str] = "local"

    def command(self, argv: list[str], env: Mapping[str, str] | None,
                reach: Reach) -> tuple[list[str], dict[str, str] | None]:
        return argv, None if env is None else dict(env)

    def stop(self) -> None:
        """The stop request, and SIGTERM to the child's process group: it stops even if it does not
        read its stdin."""
        super().stop()
        self._signal_group(signal.SIGTERM)
