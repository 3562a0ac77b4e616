"""The ssh path for real: a private sshd on loopback plays the remote host.

This machine is both hosts, so only the decision "is 127.0.0.1 this host?" is overridden; ssh, the
remote ``ringtrain run`` agent, the static rendezvous and the failure relay are all real. Needs root
(sshd runs as root), ``sshd`` and ``ssh-keygen``; skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import ringtrain.launch.driver as driver
from ringtrain.cli.main import main
from tests.processes import alive

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(SSHD is None or shutil.which("ssh-keygen") is None or shutil.which("ssh") is None,
                       reason="needs sshd, ssh and ssh-keygen"),
    pytest.mark.skipif(os.geteuid() != 0, reason="sshd needs root"),
]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sshd")
    for name in ("host", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "id.pub").read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'host'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPermitRootLogin yes\nPasswordAuthentication no\n"
        f"StrictModes no\nPidFile {folder / 'sshd.pid'}\n")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield port, str(folder / "id")
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def loopback_is_remote(monkeypatch):
    real = driver.is_local_host
    monkeypatch.setattr(driver, "is_local_host", lambda host: host != "127.0.0.1" and real(host))


def read_ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def test_two_hosts_over_ssh(sshd, loopback_is_remote, tmp_path, capsys):
    port, key = sshd
    code = main(["run", "-H", "localhost:1,127.0.0.1:2", "-p", str(port), "-i", key, sys.executable,
                 str(SCRIPTS / "report_env.py"), str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == [0, 1, 2]
    assert [(ranks[r]["HOROVOD_HOSTNAME"], ranks[r]["HOROVOD_LOCAL_RANK"], ranks[r]["HOROVOD_CROSS_SIZE"])
            for r in range(3)] == [("localhost", "0", "2"), ("127.0.0.1", "0", "2"), ("127.0.0.1", "1", "1")]
    out = capsys.readouterr().out
    assert "[2] hello from rank 2" in out


def test_remote_rank_killed_is_the_root_cause(sshd, loopback_is_remote, tmp_path, capsys):
    port, key = sshd

    def kill_rank_one() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = read_ranks(tmp_path)
            if 1 in ranks and 0 in ranks:
                time.sleep(0.5)
                os.kill(ranks[1]["pid"], signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_one, daemon=True)
    killer.start()
    code = main(["run", "-H", "localhost:1,127.0.0.1:1", "-p", str(port), "-i", key, sys.executable,
                 str(SCRIPTS / "report_env.py"), str(tmp_path), "sleep"])
    killer.join(timeout=5)
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("Root cause") == 1
    assert "host       : 127.0.0.1" in err
    assert "SIGKILL" in err
    survivors = [env["pid"] for env in read_ranks(tmp_path).values() if alive(env["pid"])]
    assert survivors == []


def test_the_secret_never_travels_on_a_command_line(sshd, loopback_is_remote, tmp_path, capsys, monkeypatch):
    port, key = sshd
    secret = "ab" * 32
    monkeypatch.setenv("RINGTRAIN_JOB_SECRET", secret)  # exported by the user: forwarded, but not on argv
    code = main(["run", "--verbose", "-H", "localhost:1,127.0.0.1:1", "-p", str(port), "-i", key,
                 sys.executable, str(SCRIPTS / "report_env.py"), str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ssh" in captured.err  # --verbose printed the remote command lines
    assert secret not in captured.err + captured.out
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == [0, 1]
    # Both hosts' ranks got the job's secret and the driver's store, from the environment / stdin.
    assert {ranks[r]["RINGTRAIN_JOB_SECRET"] for r in ranks} == {secret}
    assert len({ranks[r]["RINGTRAIN_JOB_STORE"] for r in ranks}) == 1
    assert all(secret not in " ".join(ranks[r]["argv"]) for r in ranks)
