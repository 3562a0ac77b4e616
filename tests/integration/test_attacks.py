"""The attack suite (issue 11): an outsider on the job's network against every port a job opens.

``ringtrain run -H hostA:1,hostB:1`` runs ``attack_target.py``; the outsider (``attacker.py``) runs as a
process of the other host that is not part of the job. It replays the issue's attack (read the store,
overwrite an address, connect with the token, send a pickle) against every listening port of the
job's processes, holds idle connections while the ranks set up, and sends garbage. The job must train
to the right values, no rank may unpickle anything, and nothing of ringtrain's may be readable or
writable. Port roles: the job store (hosted by node 0's agent, where the agents rendezvous through
ringtrain's handler and the ranks meet too; no torch store is left in such a job), and the ranks'
own ports (gloo's listeners; the control plane's listener lives only during setup and is covered by
tests/engine/test_control_plane.py).

One job serves the whole attack, in order: idle connections while the ranks set up, then the attack
with garbage on every port of both hosts (each job costs both hosts an agent and a rank that import
torch, and every step but the idle connections needs the ranks up, so three jobs proved no more).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, clean_env, ringtrain_argv, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = Path(__file__).resolve().parent / "attack_target.py"
ATTACKER = Path(__file__).resolve().parent / "attacker.py"
_LISTEN = re.compile(r"^LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s+users:(.*)$")


@pytest.fixture
def hosts(netns_hosts: NamespaceHosts) -> NamespaceHosts:
    return netns_hosts


class Job:
    """``ringtrain run`` of attack_target.py on hostA (rank 0) and hostB (rank 1), output in a file."""

    def __init__(self, hosts: NamespaceHosts, folder: Path, *target_args: str,
                 env: dict[str, str] | None = None) -> None:
        self.hosts, self.folder = hosts, folder
        self.log = folder / "launcher.log"
        argv = ringtrain_argv("run", "-np", "2", "-H", "hostA:1,hostB:1", "-i", str(hosts.key),
                              "--start-timeout", "120", sys.executable, str(TARGET), str(folder),
                              *target_args)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(hosts.command("hostA", argv), stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(env), cwd=ROOT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        wait_for(lambda: all((self.folder / f"ready.{r}").exists() for r in range(2))
                 or self.proc.poll() is not None, 300, "both ranks to initialize", logs=[self.log])
        assert self.proc.poll() is None, self.output()

    def finish(self) -> int:
        (self.folder / "go").touch()
        return self.proc.wait(timeout=300)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def listening(hosts: NamespaceHosts, host: str, launcher_pid: int) -> list[dict]:
    """Every TCP port a process of the job listens on at ``host``, with its role."""
    out = hosts.run(host, ["ss", "-Htlnp"], timeout=30).stdout
    found = []
    for line in out.splitlines():
        match = _LISTEN.match(line.strip())
        if not match:
            continue
        address, port, users = match.group(1).strip("[]"), int(match.group(2)), match.group(3)
        for pid in map(int, re.findall(r"pid=(\d+)", users)):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pid == launcher_pid or "ringtrain.launch.node_entry" in cmdline:
                role = "job store"  # node 0's agent hosts it (the launcher, for a one-host job)
            elif TARGET.name in cmdline:
                role = "rank"
            else:
                continue  # sshd, or another session's processes
            ip = hosts.hosts[host].address if address in ("*", "0.0.0.0") else address
            found.append({"host": ip, "port": port, "role": role, "bound": address})
            break
    return found


def run_id_of(hosts: NamespaceHosts) -> str:
    """The run id on node 0's agent command line: what ``ps`` shows every user of the host."""
    for pid in hosts.pids("hostA"):
        try:
            parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ringtrain.launch.node_entry" in parts:
            return json.loads(parts[parts.index(b"ringtrain.launch.node_entry") + 1])["rdzv_id"]
    raise AssertionError("node 0's agent is not running")


def attack(hosts: NamespaceHosts, attacks: dict[str, list[dict]], run_id: str, folder: Path,
           *extra: str) -> dict:
    """Attack each host's ``targets`` from the host named with them, all at once (each waits seconds
    for answers that never come); what every port let through."""
    running = []
    for from_host, targets in attacks.items():
        report = folder / f"{from_host}-ours.json"
        argv = [sys.executable, str(ATTACKER), "probe", json.dumps(targets), run_id, str(folder), str(report),
                *extra]
        proc = subprocess.Popen(hosts.command(from_host, argv), env=clean_env(), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        running.append((proc, report))
    found = {}
    for proc, report in running:
        try:
            output, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, output
        found.update(json.loads(report.read_text()))
    return found


def open_idle_connections(hosts: NamespaceHosts, job: Job,
                          folder: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Once node 0's job store listens, 50 connections to it from hostB that never send a byte: the
    outsider's process, the file that lets it go, and its report."""
    store_port: list[dict] = []

    def job_store_listens() -> bool:
        store_port[:] = [p for p in listening(hosts, "hostA", job.proc.pid) if p["role"] == "job store"]
        return bool(store_port) or job.proc.poll() is not None

    wait_for(job_store_listens, 120, "the launcher's job store", logs=[job.log])
    assert store_port, job.output()
    target = f"{store_port[0]['host']}:{store_port[0]['port']}"
    ready, release, report = folder / "idle.ready", folder / "idle.release", folder / "idle.json"
    argv = [sys.executable, str(ATTACKER), "idle", target, "50", str(ready), str(release), str(report)]
    outsider = subprocess.Popen(hosts.command("hostB", argv), env=clean_env(), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: ready.exists() or outsider.poll() is not None, 120, "50 idle connections")
    assert json.loads(ready.read_text())["opened"] == 50
    return outsider, release, report


def test_an_outsider_cannot_hold_up_init_read_rewrite_join_inject_or_draw_a_stack_trace(
        hosts: NamespaceHosts, tmp_path: Path) -> None:
    # One job for the whole outsider (it used to be three jobs: idle connections, the attack, garbage to
    # every port of hostA, which the attack from hostB sends too). First idle connections during setup:
    # the job store keeps unproven connections for 600 s here, so init cannot be waiting for any of them.
    job = Job(hosts, tmp_path, "--wait-start", env={"RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS": "600"})
    outsider = None
    try:
        outsider, release, idle_report = open_idle_connections(hosts, job, tmp_path)
        (tmp_path / "start").touch()  # the ranks set up now, with the 50 connections pending
        job.wait_ready()
        release.touch()
        assert outsider.wait(timeout=120) == 0
        # Init finished while the server still held all 50 unproven connections.
        assert json.loads(idle_report.read_text()) == {"opened": 50, "open_at_release": 50}

        ports = {host: listening(hosts, host, job.proc.pid) for host in ("hostA", "hostB")}
        roles = sorted(p["role"] for found in ports.values() for p in found)
        assert "job store" in roles
        assert "rank" in roles
        run_id = run_id_of(hosts)
        # Every port of hostA from hostB (node 0's job store among them), and every port of hostB from
        # hostA, garbage included: every port is ringtrain's own (node 0's agent store is the job store).
        attacks = {}
        for target_host, from_host in (("hostA", "hostB"), ("hostB", "hostA")):
            ours = [p for p in ports[target_host] if p["role"] != "agent store"]
            if ours:
                attacks[from_host] = ours
        reports = attack(hosts, attacks, run_id, tmp_path, "--garbage")
        if not [where for where in reports if where.startswith(f"{hosts.hosts['hostA'].address}:")]:
            pytest.fail("no port of hostA to attack")  # (not the expected failure: no AssertionError)
        code = job.finish()
    finally:
        job.kill()
        if outsider is not None and outsider.poll() is None:
            outsider.kill()
    output = job.output()
    assert code == 0, output
    assert sorted(p.name for p in tmp_path.glob("done.*")) == ["done.0", "done.1"], output
    assert list(tmp_path.glob("pwned-*")) == [], "a rank unpickled the outsider's payload"
    for where, report in reports.items():
        assert not report["job_store_joined"], (where, report)
        assert not report["ctrl_accepted"], (where, report)
        if report["role"] == "agent store":
            # torch's own store answers anybody (docs/security.md), but holds nothing of ringtrain's
            assert not [k for k in report.get("listed_keys", []) if "ringtrain" in k], (where, report)
            assert not [k for k in report.get("read", {}) if "ringtrain" in k], (where, report)
        else:
            assert not report["torch_store"], (where, report)
            assert "read" not in report, (where, report)
            assert "wrote" not in report, (where, report)
    assert "Traceback" not in output
    assert "Exception raised from" not in output  # no C++ stack trace in the job's output
    refusals = [line for line in output.splitlines()
                if "ringtrain job store" in line and "closed a connection" in line]
    assert len(refusals) == 1, output  # one line for the outsider's host, the rest counted
    assert "from 10.231.0.2:" in refusals[0]
    # The job's own addresses: the job store and every rank port listen on the hosts' link address,
    # not on every interface.
    for found in ports.values():
        for port in found:
            if port["role"] != "agent store":
                assert port["bound"] not in ("*", "0.0.0.0"), ports
