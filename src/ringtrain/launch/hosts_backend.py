"""The elastic driver's backend of this machine and ssh hosts (``-H``, ``--hostfile``, a discovery script):
a host this machine answers to runs its workers as its children, every other one over ssh, with the
job's secret on the ssh channel (launch/backend.py has the interface)."""

from __future__ import annotations

from typing import cast

from ringtrain.engine.auth import ENV_SECRET
from ringtrain.exceptions import UsageError
from ringtrain.launch import link, supervision
from ringtrain.launch.backend import WorkerStart, log, remote_environment, without_enclosing_launcher
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.elastic_hosts import FixedHosts, ScriptDiscovery
from ringtrain.launch.hosts import is_local_host
from ringtrain.launch.places import PLACES


class HostsBackend:
    """This machine and hosts reached by ssh, as ``-H``/``--hostfile`` or a discovery script names them
    (a host this machine answers to runs its workers as its children, every other one over ssh)."""

    def __init__(self, discovery: FixedHosts | ScriptDiscovery, config: LaunchConfig) -> None:
        self.discovery = discovery
        self.config = config

    def describe(self) -> str:
        return self.discovery.describe()

    def find(self) -> dict[str, int]:
        return self.discovery.find()

    def listens_beyond_loopback(self) -> bool:
        # Hosts may come from anywhere (discovery) or sit on other machines: every interface then, and
        # every connection must prove the job's secret before the store reads a byte of it.
        discovery = self.discovery
        return not (isinstance(discovery, FixedHosts) and all(is_local_host(h) for h in discovery.hosts))

    def beat_interval(self, peer_timeout: float) -> float:
        return link.beat_interval(peer_timeout)

    def start_worker(self, start: WorkerStart) -> supervision.RankGroup:
        if is_local_host(start.host):
            env = without_enclosing_launcher(start.environ)
            env.update(start.ours)
            env[ENV_SECRET] = start.secret
            return self._spawn(start, "local", env)
        group = self._spawn(start, "ssh", remote_environment(start))
        if start.verbose:
            log(f"worker {start.wid} on {start.host}: {' '.join(cast('list[str]', group.proc.args))}")
        # The secret travels on the ssh channel, never on the remote command line.
        link.send_secret(group.proc.stdin, start.secret)
        return group

    def _spawn(self, start: WorkerStart, place: str, env: dict[str, str]) -> supervision.ProcessGroup:
        config = self.config
        reach = supervision.Reach(port=config.ssh_port, identity_file=config.ssh_identity_file,
                                  connect_timeout=config.start_timeout, alive_timeout=start.silence_limit)
        try:
            # talks=False: a worker speaks the link once it beats (a command exec'd as another
            # program never does, and its stdin gets nothing of ours)
            started = cast("type[supervision.ProcessGroup]", PLACES[place])  # local and ssh: processes
            return started(start.host, list(start.argv), env, reach=reach, talks=False, lock=start.lock)
        except OSError as exc:
            program, fix = ("ssh", "install the ssh client") if place == "ssh" else \
                (start.argv[0], "check the Python installation")
            raise UsageError(f"cannot start worker {start.wid} on {start.host}: {program}: {exc.strerror}. "
                             f"HINT: {fix} on this machine.") from None

    def not_started_text(self, wid: str, group: supervision.RankGroup) -> str:
        return f"ssh could not start it ({(group.tail or ['no output'])[-1].strip()})"

    def hosts_changed(self, group: supervision.RankGroup) -> bool:
        return False  # a failed ssh host stays in the listing; the blacklist keeps it out

    def release(self) -> None:
        pass  # nothing reserved: the hosts were the user's already


__all__ = ["HostsBackend"]
