"""Errors that Horovod scripts catch by name (``horovod.common.exceptions``)."""

from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """A collective failed: ranks disagreed on a request, a peer died, or the engine shut down.

    Elastic training catches it to restore the last committed state and re-initialize.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; elastic training should re-initialize.

    ``skip_sync`` is True when hosts were only removed, so the surviving state needs no broadcast.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated" + (" (skip sync)" if skip_sync else ""))
        self.skip_sync = skip_sync


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
