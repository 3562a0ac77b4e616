"""A group of ranks on another host, reached over ssh: the ssh client is the child process here,
and the link (secret, requests, heartbeats) travels on its stdin and stderr."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ringtrain.launch.remote import cwd_for_remote, host_key_message, host_key_refused, remote_command
from ringtrain.launch.supervision import ProcessGroup, Reach

#: ssh's exit code when it could not connect, or its session broke.
SSH_FAILED = 255


class SshGroup(ProcessGroup):
    """``ssh host 'cd CWD && exec env VARS argv'``: ``env`` holds the variables sent along."""

    kind: ClassVar[str] = "ssh"

    def command(self, argv: list[str], env: Mapping[str, str] | None,
                reach: Reach) -> tuple[list[str], dict[str, str] | None]:
        cmd = remote_command(self.host, argv, dict(env or {}), reach.cwd or cwd_for_remote(), reach.port,
                             reach.identity_file, reach.connect_timeout, alive_timeout=reach.alive_timeout)
        return cmd, None

    def unreachable(self) -> bool:
        return self.poll() == SSH_FAILED

    def lost_contact(self) -> bool:
        last = self.last_error()
        return self.unreachable() and ("not responding" in last or "timed out" in last.lower())

    def describe_end(self, what: str) -> str:
        """ssh's exit code 255 says the host or the session went; its last line says which."""
        if not self.unreachable():
            return super().describe_end(what)
        last = self.last_error()
        if host_key_refused(last):
            return host_key_message(self.host, "\n".join(self.tail))
        if self.lost_contact():
            return (f"lost contact with host {self.host}: ssh: {last} (the host is down or the network to "
                    "it is cut)")
        return (f"{what} on host {self.host} ended without a report (ssh exit code 255: it was killed, or "
                f"its ssh session broke{': ' + last if last else ''})")
