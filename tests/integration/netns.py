"""Hosts of our own: two network namespaces joined by a veth pair, each with its own sshd.

Namespaces ``rt<pid>-hostA`` (10.231.0.1) and ``rt<pid>-hostB`` (10.231.0.2) see each other as
``hostA`` and ``hostB``. The pytest process id in the names keeps concurrent test sessions on one
machine (a team sharing it) apart; sets left by a session that died are removed by the next one.
Each host also gets its own UTS namespace, so ``hostname`` there says ``hostA``/``hostB`` and a
launcher's "which host am I" logic is exercised for real. The file system is shared (one machine),
so the repo, the venv and the data are at the same paths on both hosts, as on a cluster with a
shared home.

Nothing global is edited: the host names live in ``/etc/netns/<ns>/hosts`` and the ssh client
settings (known hosts, the generated key as the default identity, as a cluster's ~/.ssh would have
it) in ``/etc/netns/<ns>/ssh/ssh_config``, which ``ip netns exec`` bind-mounts
over ``/etc/hosts`` and ``/etc/ssh`` for processes of that namespace only. Those files, the
namespaces and the sshds are removed at teardown; a stale set from a killed session is removed at
start-up. An sshd dies with the test session (see ``spawn_daemon``).

Root logs in with a generated key (``AuthorizedKeysFile`` in the temp dir, ``StrictModes no``).
``bandwidth`` puts a ``tc qdisc tbf`` on both ends of the link to give it a real rate. ``delay_ms``
gives it latency too: this kernel has no ``netem``, so the hosts are then joined by two TAP devices
and a forwarding process that holds every frame for the delay (``delay_link.py``), not by a veth pair.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.integration.system import (
    clean_env,
    skip_unless_commands,
    skip_unless_root,
    spawn_daemon,
    stop_daemons,
    wait_for,
)

SUBNET = "10.231.0"
#: An address on the link that nobody answers: a host that is down (ARP fails: "No route to host").
UNREACHABLE_ADDRESS = f"{SUBNET}.99"
#: An address routed through hostB, which does not forward: packets vanish without an answer, like a
#: firewall that drops them. Only a timeout ends a connection attempt.
SILENT_ADDRESS = "10.231.1.5"
NETNS_ETC = Path("/etc/netns")
_OUR_NAMESPACE = re.compile(r"^rt(\d+)-host[AB]$")
DELAY_LINK = Path(__file__).resolve().with_name("delay_link.py")
#: MTU of the TAP link: large frames keep the forwarder's per-frame cost low.
DELAY_LINK_MTU = 64000


@dataclass(frozen=True)
class Host:
    """One namespace host: its name as the others resolve it, namespace, interface, address."""

    name: str
    namespace: str
    interface: str
    address: str


#: Numbers the NamespaceHosts of this process (interface names allow 15 characters, so a letter).
_INSTANCES = itertools.count()


class NamespaceHosts:
    """``hostA`` and ``hostB`` with sshd on port 22; commands run inside via :meth:`command`."""

    def __init__(self, root: Path, bandwidth: str | None = None, delay_ms: float | None = None) -> None:
        self.root = root
        self.bandwidth = bandwidth
        self.delay_ms = delay_ms
        self._forwarder: subprocess.Popen[bytes] | None = None
        # one set of names per instance: a test's own hosts (a shaped link) live beside the session's,
        # and stopping them must not delete the session's namespaces
        serial = next(_INSTANCES)
        tag = f"rt{os.getpid()}" + (chr(ord("a") + serial - 1) if serial else "")
        self.hosts = {name: Host(name, f"{tag}-{name}", f"{tag}-v{name[-1]}", f"{SUBNET}.{i}")
                      for i, name in enumerate(("hostA", "hostB"), start=1)}
        #: A name that resolves (on both hosts) to an address where no host is: for unreachable-host tests.
        self.unreachable = "hostDown"
        #: A name whose packets are silently dropped (connection attempts hang until a timeout).
        self.silent = "hostSilent"
        self.key = root / "id_ed25519"
        self._procs: list[subprocess.Popen[bytes]] = []

    # --- running things on a host --------------------------------------------------------------

    def command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` as run on ``host``: in its network namespace, with its hostname."""
        h = self.hosts[host]
        return ["ip", "netns", "exec", h.namespace, "unshare", "--uts", "sh", "-c",
                f'hostname {h.name} && exec "$@"', "sh", *argv]

    def daemon_command(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` on ``host`` like :meth:`command`, but with this machine's ``/sys`` left in place.

        ``ip netns exec`` mounts a fresh sysfs, which hides ``/sys/fs/cgroup``: slurmd refuses to start
        without it. Here the network namespace is entered with ``nsenter`` and the name files of
        ``/etc/netns/<ns>/`` are bind-mounted over ``/etc`` in a private mount namespace, as ``ip netns
        exec`` does, so the process resolves and ssh-es exactly as one started by :meth:`command`.
        """
        h = self.hosts[host]
        etc = NETNS_ETC / h.namespace
        script = (f'for f in {etc}/*; do mount --bind "$f" "/etc/${{f##*/}}" || exit 1; done; '
                  f'hostname {h.name} && exec "$@"')
        return ["nsenter", f"--net=/run/netns/{h.namespace}", "unshare", "--mount", "--uts", "sh", "-c",
                script, "sh", *argv]

    def run(self, host: str, argv: list[str], timeout: float = 300.0,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` and capture its output as text."""
        return subprocess.run(self.command(host, argv), env=clean_env(env), cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)

    def ssh(self, from_host: str, to_host: str, remote: str,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``ssh to_host remote`` from ``from_host`` with the generated key."""
        argv = ["ssh", "-i", str(self.key), "-o", "BatchMode=yes", f"root@{to_host}", remote]
        return self.run(from_host, argv, timeout=timeout)

    def pids(self, host: str) -> list[int]:
        """Processes living in ``host``'s network namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[host].namespace], capture_output=True,
                             text=True, check=True)
        return [int(pid) for pid in out.stdout.split()]

    # --- breaking the link ------------------------------------------------------------------------

    def set_link(self, up: bool) -> None:
        """Cut the link between the hosts for good (``ip link set <veth> down``), or restore it."""
        host = self.hosts["hostA"]
        _ip("-n", host.namespace, "link", "set", host.interface, "up" if up else "down")
        if up:
            # the kernel drops routes through an interface that goes down: the silent host's comes back
            self._route_silent_address()

    def _route_silent_address(self) -> None:
        """hostA sends SILENT_ADDRESS's packets to hostB, whose namespace does not forward (the default)."""
        a, b = self.hosts["hostA"], self.hosts["hostB"]
        _ip("-n", a.namespace, "route", "replace", f"{SILENT_ADDRESS}/32", "via", b.address)

    def mac(self, host: str) -> str:
        """The MAC address of ``host``'s end of the link."""
        h = self.hosts[host]
        out = subprocess.run(["ip", "-n", h.namespace, "-o", "link", "show", h.interface],
                             capture_output=True, text=True, check=True).stdout
        return out.split("link/ether", 1)[1].split()[0]

    @contextlib.contextmanager
    def impaired(self, loss: float, delay_ms: float) -> Iterator[None]:
        """Loss and delay on the link in both directions while inside (``lossy_link``: no netem here)."""
        procs = []
        try:
            for host, peer in (("hostA", "hostB"), ("hostB", "hostA")):
                argv = [sys.executable, "-m", "tests.integration.lossy_link", self.hosts[host].interface,
                        self.hosts[peer].address, self.mac(peer), "--loss", str(loss), "--delay-ms",
                        str(delay_ms), "--seed", str(len(procs))]
                proc = subprocess.Popen(self.command(host, argv), stdout=subprocess.PIPE, text=True,
                                        cwd=Path(__file__).resolve().parents[2])
                procs.append(proc)
                if proc.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                    raise RuntimeError(f"the lossy link forwarder on {host} did not start")
            yield
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    # --- life cycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Create namespaces, link, name files, keys and sshds; wait until ssh works both ways."""
        remove_stale_namespaces()
        self.stop()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ringtrain-test",
                        "-f", str(self.key)], check=True)
        (self.root / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        a, b = self.hosts["hostA"], self.hosts["hostB"]
        if self.delay_ms is None:
            _ip("link", "add", a.interface, "type", "veth", "peer", "name", b.interface)
        else:
            self._start_forwarder(a, b)
        known_hosts = []
        for host in (a, b):
            _ip("netns", "add", host.namespace)
            _ip("link", "set", host.interface, "netns", host.namespace)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            if self.delay_ms is not None:
                _ip("-n", host.namespace, "link", "set", host.interface, "mtu", str(DELAY_LINK_MTU))
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            if self.bandwidth:
                _tc(host.namespace, "qdisc", "add", "dev", host.interface, "root", "tbf",
                    "rate", self.bandwidth, "burst", "256kb", "latency", "50ms")
            host_key = self.root / f"ssh_host_key_{host.name}"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
            public = host_key.with_suffix(".pub").read_text().split()
            known_hosts.append(f"{host.name},{host.address} {public[0]} {public[1]}")
        (self.root / "known_hosts").write_text("\n".join(known_hosts) + "\n")
        for host in (a, b):
            self._write_etc(host)
        self._route_silent_address()
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        for host in (a, b):
            config = self._write_sshd_config(host)
            self._procs.append(spawn_daemon(self.command(host.name, [shutil.which("sshd") or "/usr/sbin/sshd",
                                                                      "-D", "-e", "-f", str(config)]),
                                            self.root / f"sshd_{host.name}.log"))
        for src, dst in (("hostA", "hostB"), ("hostB", "hostA"), ("hostA", "hostA")):
            wait_for(lambda s=src, d=dst: self._ssh_ok(s, d), 30, f"ssh from {src} to {dst}",
                     logs=[self.root / f"sshd_{h}.log" for h in self.hosts])

    def _start_forwarder(self, a: Host, b: Host) -> None:
        """Start the delaying forwarder; it creates both TAP devices (moved into the hosts after)."""
        log = self.root / "delay_link.log"
        log.write_text("")
        self._forwarder = spawn_daemon([sys.executable, str(DELAY_LINK), "--tap-a", a.interface, "--tap-b",
                                        b.interface, "--delay-ms", f"{self.delay_ms:g}"], log)
        self._procs.append(self._forwarder)
        wait_for(lambda: "ready" in log.read_text() or self._forwarder.poll() is not None, 30,
                 "the delay forwarder to create its TAP devices", logs=[log])
        if self._forwarder.poll() is not None:
            raise RuntimeError(f"the delay forwarder exited with {self._forwarder.returncode}: "
                               f"{log.read_text().strip()}")

    def forwarder_stats(self) -> dict[str, object] | None:
        """Frames, bytes and CPU seconds of the delay forwarder (after ``stop``; None without delay)."""
        log = self.root / "delay_link.log"
        if self.delay_ms is None or not log.exists():
            return None
        lines = [line for line in log.read_text().splitlines() if line.startswith("stats ")]
        return json.loads(lines[-1][len("stats "):]) if lines else None

    def _ssh_ok(self, src: str, dst: str) -> bool:
        for proc in self._procs:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {proc.returncode}; see {self.root}/sshd_*.log")
        result = self.ssh(src, dst, "hostname", timeout=20)
        return result.returncode == 0 and result.stdout.strip() == dst

    def _write_etc(self, host: Host) -> None:
        etc = NETNS_ETC / host.namespace
        (etc / "ssh").mkdir(parents=True, exist_ok=True)
        names = [f"{h.address}\t{h.name}" for h in self.hosts.values()]
        names += [f"{UNREACHABLE_ADDRESS}\t{self.unreachable}", f"{SILENT_ADDRESS}\t{self.silent}"]
        (etc / "hosts").write_text("\n".join(["127.0.0.1\tlocalhost", "::1\tlocalhost", *names]) + "\n")
        # The whole of /etc/ssh is replaced in the namespace: this is all the ssh client needs.
        (etc / "ssh" / "ssh_config").write_text(
            "Host *\n"
            f"    IdentityFile {self.key}\n"
            f"    UserKnownHostsFile {self.root / 'known_hosts'}\n"
            "    StrictHostKeyChecking yes\n"
            "    LogLevel ERROR\n")

    def _write_sshd_config(self, host: Host) -> Path:
        config = self.root / f"sshd_config_{host.name}"
        config.write_text(
            f"ListenAddress {host.address}\n"
            "ListenAddress 127.0.0.1\n"
            "Port 22\n"
            f"HostKey {self.root / f'ssh_host_key_{host.name}'}\n"
            "PidFile none\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            "LogLevel ERROR\n")
        return config

    def stop(self) -> None:
        """Stop the sshds, delete namespaces (their veth ends go with them) and the name files."""
        stop_daemons(self._procs)
        self._procs.clear()
        for host in self.hosts.values():
            if Path(f"/run/netns/{host.namespace}").exists():
                for pid in self.pids(host.name):
                    _kill(pid)  # remote ranks a failed test left behind
                subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)
            subprocess.run(["ip", "link", "del", host.interface], capture_output=True)
            shutil.rmtree(NETNS_ETC / host.namespace, ignore_errors=True)
        try:
            NETNS_ETC.rmdir()  # only if we were its last user
        except OSError:
            pass


def remove_stale_namespaces() -> None:
    """Delete namespace hosts (and their name files) whose test session is gone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for namespace in {line.split()[0] for line in listing.splitlines() if line.strip()}:
        match = _OUR_NAMESPACE.match(namespace)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
        for pid in pids.split():
            _kill(int(pid))
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _tc(namespace: str, *args: str) -> None:
    result = subprocess.run(["ip", "netns", "exec", namespace, "tc", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)} in {namespace} failed: {result.stderr.strip()}")


def start_hosts(root: Path, bandwidth: str | None = None, delay_ms: float | None = None) -> NamespaceHosts:
    """Started hosts, or a pytest skip naming what is missing."""
    skip_unless_root("network namespaces")
    skip_unless_commands("ip", "tc", "sshd", "ssh", "ssh-keygen", "unshare")
    probe_name = f"rt{os.getpid()}-probe"
    probe = subprocess.run(["ip", "netns", "add", probe_name], capture_output=True, text=True)
    if probe.returncode != 0:
        import pytest

        pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe_name], capture_output=True)
    hosts = NamespaceHosts(root, bandwidth, delay_ms)
    try:
        hosts.start()
    except BaseException:
        hosts.stop()
        raise
    return hosts
