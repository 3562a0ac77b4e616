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


def test_host_keys_are_checked_against_known_hosts_accepting_only_a_first_key_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(remote.ENV_HOST_KEY_CHECKING, raising=False)
    command = remote_command("hostB", ["true"], {}, "/w", None, None, 10)
    assert "StrictHostKeyChecking=accept-new" in command
    # the user's known_hosts (ssh's own default), never a file of ours, never unchecked
    assert not [w for w in command if w.startswith(("StrictHostKeyChecking=no", "UserKnownHostsFile"))]
    monkeypatch.setenv(remote.ENV_HOST_KEY_CHECKING, "yes")
    assert "StrictHostKeyChecking=yes" in remote_command("hostB", ["true"], {}, "/w", None, None, 10)
    for bad in ("no", "off", "maybe"):
        monkeypatch.setenv(remote.ENV_HOST_KEY_CHECKING, bad)
        with pytest.raises(UsageError, match=rf"RINGTRAIN_SSH_HOST_KEY_CHECKING='{bad}' is not one of "
                                             r"accept-new, yes\. HINT"):
            remote.ssh_base("hostB", None, None, 10)


#: What OpenSSH prints when a host presents another key than the one known for it (as the integration
#: test tests/integration/test_ssh_host_keys.py sees it from the real client).
CHANGED_KEY = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
               "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
               "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
               "Host key for job-worker-1 has changed and you have requested strict checking.\n"
               "Host key verification failed.")


def test_a_changed_host_key_is_named_with_the_host_and_the_fix_and_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_ssh(tmp_path, 10**6, CHANGED_KEY)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(UsageError) as caught:
        remote.probe_hosts(["job-worker-1"], None, None, timeout=120)
    message = str(caught.value)
    assert message.startswith("host job-worker-1: ssh refused its host key (Host key verification failed)")
    assert "no job (nor its secret) was sent to it" in message
    assert "HINT: if the host was reinstalled, remove the old key with `ssh-keygen -R job-worker-1`" \
        in message
    assert len(calls.read_text().split()) == 1
