"""What reaches another host over ssh (launch/remote.py): the forwarded environment, never the secret."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ringtrain.exceptions import UsageError
from ringtrain.launch import remote
from ringtrain.launch.remote import forwarded_environment, remote_command

SECRET = "e" * 64


def test_the_secret_and_the_store_address_are_never_forwarded_on_the_command_line():
    environ = {"PATH": "/bin", "HOROVOD_CYCLE_TIME": "3", "RINGTRAIN_JOB_SECRET": SECRET,
               "RINGTRAIN_JOB_STORE": "10.0.0.1:4000", "RINGTRAIN_ROUND_TIMEOUT_SECONDS": "60"}
    env = forwarded_environment(environ)
    assert env == {"PATH": "/bin", "HOROVOD_CYCLE_TIME": "3", "RINGTRAIN_ROUND_TIMEOUT_SECONDS": "60"}
    command = remote_command("hostB", ["python", "-m", "ringtrain.launch.node_entry", "{}"], env, "/w",
                             None, None, 10)
    assert SECRET not in " ".join(command)
    assert "RINGTRAIN_JOB_STORE" not in " ".join(command)


def _fake_ssh(folder: Path, failures: int, message: str) -> Path:
    """An ``ssh`` that fails ``failures`` times with ``message``, then succeeds; it counts its calls."""
    calls = folder / "calls"
    script = folder / "ssh"
    script.write_text(f"#!/bin/sh\necho x >> {calls}\n"
                      f"if [ $(wc -l < {calls}) -le {failures} ]; then echo '{message}' >&2; exit 255; fi\n")
    script.chmod(0o755)
    return calls


def test_a_pod_not_up_yet_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_ssh(tmp_path, 2, "ssh: Could not resolve hostname job-worker-1.job.default.svc: Name or "
                                   "service not known")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(remote, "RETRY_INTERVAL", 0.01)
    remote.probe_hosts(["job-worker-1.job.default.svc"], None, None, timeout=120)
    assert len(calls.read_text().split()) == 3
    assert "job-worker-1.job.default.svc is not up yet (ssh: Could not resolve" in capsys.readouterr().err


def test_a_pod_never_up_is_named_after_start_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ssh(tmp_path, 10**6, "ssh: connect to host job-worker-1 port 22: Connection refused")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(remote, "RETRY_INTERVAL", 0.01)
    with pytest.raises(UsageError, match=r"host job-worker-1 unreachable over ssh within 0.3 s: .*Connection "
                                         r"refused \(\d+ tries\)"):
        remote.probe_hosts(["job-worker-1"], None, None, timeout=0.3)


def test_a_refused_key_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_ssh(tmp_path, 10**6, "root@job-worker-1: Permission denied (publickey).")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(UsageError, match=r"Permission denied \(publickey\)\. HINT"):
        remote.probe_hosts(["job-worker-1"], None, None, timeout=120)
    assert len(calls.read_text().split()) == 1
