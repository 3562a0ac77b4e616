"""``ringtrain run -H hostA:1,hostB:1`` across two hosts in network namespaces, reached over ssh.

The launcher runs on hostA; rank 1 lives on hostB behind sshd, across a 1 Gbit/s veth link.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ringtrain
from tests.integration.netns import NamespaceHosts
from tests.integration.system import (
    ROOT,
    SHARED_DATA,
    clean_env,
    ringtrain_argv,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "mnist_cnn_multihost.py"
#: Allreduces until a fault ends the job (test_failures.py's job): no CNN computed while waiting for the kill.
FAULT_JOB = Path(__file__).resolve().with_name("fault_job.py")
MNIST = SHARED_DATA / "mnist"


@pytest.fixture
def hosts(netns_hosts: NamespaceHosts) -> NamespaceHosts:
    """The namespace hosts, once ringtrain can launch and reduce across them."""
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"real MNIST not found under {MNIST} (the shared data folder beside the repo)")
    return netns_hosts


def _run_argv(hosts: NamespaceHosts, host_list: str, *command: str, start_timeout: int = 120) -> list[str]:
    return ringtrain_argv("run", "-np", "2", "-H", host_list, "-i", str(hosts.key),
                          "--start-timeout", str(start_timeout), *command)


def _train_command(*extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--data-dir", str(MNIST), "--train-samples", "1024",
            "--test-samples", "500", "--lr", "0.05", "--log-every", "4", *extra]


def test_mnist_cnn_trains_across_two_hosts(hosts: NamespaceHosts) -> None:
    result = hosts.run("hostA", _run_argv(hosts, "hostA:1,hostB:1", *_train_command("--epochs", "2")),
                       timeout=540, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "rank 0 of 2 on hostA" in output
    assert "rank 1 of 2 on hostB" in output
    final = [line for line in output.splitlines() if "final: " in line]
    assert len(final) == 1, output
    assert "32 steps on 2 ranks" in final[0]  # 2 epochs x (512 images per rank / 32 per batch)
    accuracy = float(final[0].rsplit("test accuracy", 1)[1])
    assert accuracy > 0.3, final[0]  # chance is 0.1; 32 steps at this rate reach about 0.6


def _remote_rank_pid(hosts: NamespaceHosts, script: str) -> int | None:
    """The training process of rank 1 on hostB (not the ssh session or an agent wrapping it)."""
    found = {}
    for pid in hosts.pids("hostB"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(script.encode() in part for part in cmdline) and b"RANK=1" in environ:
            found[pid] = ppid
    leaves = [pid for pid in found if pid not in found.values()]
    return leaves[0] if len(leaves) == 1 else None


def test_killed_remote_rank_fails_the_job_naming_its_host(hosts: NamespaceHosts, tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    argv = hosts.command("hostA", _run_argv(hosts, "hostA:1,hostB:1", sys.executable, str(FAULT_JOB),
                                            str(tmp_path), "--steps", "0"))
    with open(log, "w") as out:
        launcher = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=ROOT)
    try:
        wait_for(lambda: "step 4 " in log.read_text() or launcher.poll() is not None, 300,
                 "training to start on both hosts", logs=[log])
        assert launcher.poll() is None, log.read_text()
        pid = _remote_rank_pid(hosts, FAULT_JOB.name)
        assert pid is not None, f"rank 1's process not found on hostB\n{log.read_text()}"
        os.kill(pid, signal.SIGKILL)
        code = launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    output = log.read_text()
    assert code != 0, output
    assert "hostB" in output
    assert "SIGKILL" in output or "signal 9" in output, output


@pytest.mark.parametrize("kind", ["down", "silent"])
def test_unreachable_host_is_reported_within_start_timeout(hosts: NamespaceHosts, kind: str) -> None:
    # down: no host at the address, refused at once; silent: packets dropped, only a timeout ends it.
    name = hosts.unreachable if kind == "down" else hosts.silent
    start_timeout = 15
    argv = _run_argv(hosts, f"hostA:1,{name}:1", sys.executable, "-c", "pass", start_timeout=start_timeout)
    # The subprocess timeout is only a hang guard: the launcher must give up by itself.
    result = hosts.run("hostA", argv, timeout=start_timeout + 120, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert name in output
    assert "Traceback" not in output, output


def test_check_passes_across_two_hosts(hosts: NamespaceHosts) -> None:
    check = ringtrain_argv("check", "--sizes", "4K,1M", "--iterations", "3")
    argv = _run_argv(hosts, "hostA:1,hostB:1", *check)
    result = hosts.run("hostA", argv, timeout=300, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "hello from rank 0 of 2 (host hostA, local rank 0, device cpu)" in output
    assert "hello from rank 1 of 2 (host hostB, local rank 0, device cpu)" in output
    assert "all checks passed on 2 rank(s)" in output
    # Across hosts: each host's interfaces, where each rank is reached, the link between the hosts.
    a, b = hosts.hosts["hostA"], hosts.hosts["hostB"]
    assert "hosts: 2" in output
    assert re.search(r"hostA: ranks 0; ringtrain \S+, torch \S+, python \S+\n", output), output
    assert re.search(r"hostB: ranks 1; .*, clock [+-]\d\.\d+ s vs hostA", output), output
    assert f"interfaces: lo 127.0.0.1, {a.interface} {a.address}" in output
    assert f"interfaces: lo 127.0.0.1, {b.interface} {b.address}" in output
    assert f"rank 0 (hostA): {a.address}" in output
    assert f"rank 1 (hostB): {b.address}" in output
    link = re.search(r"hostA <-> hostB\s+([\d.]+) MB/s", output)
    assert link is not None, output
    assert 0 < float(link.group(1)) < 1000 / 8 * 1.2  # the link is shaped to 1 Gbit/s (125 MB/s)
    assert "WARNING" not in output  # one machine: same versions, same clock


def test_check_warns_when_the_hosts_run_different_versions(hosts: NamespaceHosts) -> None:
    # The same install is on both hosts here (a shared file system), so rank 1 on hostB pretends.
    pretend = ("import os, sys, ringtrain; from ringtrain.cli.main import main\n"
               "if os.environ['RANK'] == '1':\n    ringtrain.__version__ = '9.9.9'\n"
               "sys.exit(main(['check', '--no-bandwidth']))")
    result = hosts.run("hostA", _run_argv(hosts, "hostA:1,hostB:1", "python", "-c", pretend), timeout=300,
                       cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output  # a warning, not a failed check
    assert (f"WARNING: ringtrain versions differ between ranks: {ringtrain.__version__} on hostA (rank 0); "
            "9.9.9 on hostB (rank 1).") in output
    assert "HINT: install the same version on every host" in output
