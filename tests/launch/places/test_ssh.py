"""The ssh place (launch/places/ssh.py): the command line it runs, and what ssh's exit code 255 means.

A fake ``ssh`` on PATH records its arguments and ends as a real one would on a broken link."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ringtrain.launch.places import PLACES, SshGroup
from ringtrain.launch.supervision import Reach


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fake_ssh(last_line, code)``: an ssh that records its argv in argv.json, says ``last_line``
    on stderr and exits with ``code``."""
    def make(last_line: str, code: int) -> Path:
        ssh = tmp_path / "ssh"
        ssh.write_text(f"#!{sys.executable}\nimport json, sys\n"
                       f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                       f"print({last_line!r}, file=sys.stderr)\nsys.exit({code})\n")
        ssh.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
        return tmp_path / "argv.json"
    return make


def start(argv=("python", "-m", "x"), env=None, reach=None) -> SshGroup:
    group = PLACES["ssh"]("hostB", list(argv), env or {}, reach=reach or Reach())
    group.wait(timeout=60)
    group.join_output(timeout=10)
    return group


def test_the_command_runs_in_the_same_folder_with_the_variables_and_ssh_settings_given(fake_ssh):
    record = fake_ssh("", 0)
    start(["python", "-m", "ringtrain.launch.node_entry", "{}"], {"HOROVOD_CYCLE_TIME": "2"},
          Reach(port=2222, identity_file="key", connect_timeout=7, alive_timeout=8, cwd="/data/job"))
    argv = json.loads(record.read_text())
    assert argv[-2] == "hostB"
    assert argv[-1] == ("cd /data/job && exec env HOROVOD_CYCLE_TIME=2 python -m ringtrain.launch.node_entry "
                        "'{}'")
    options = " ".join(argv[:-2])
    for expected in ("-p 2222", "-i key", "ConnectTimeout=7", "ServerAliveInterval=2",
                     "ServerAliveCountMax=4", "BatchMode=yes"):
        assert expected in options


def test_exit_code_255_after_a_timeout_is_lost_contact_with_the_host(fake_ssh):
    fake_ssh("Timeout, server hostB not responding.", 255)
    group = start()
    assert group.unreachable()
    assert group.lost_contact()
    assert group.describe_end("the agent of node 1") == (
        "lost contact with host hostB: ssh: Timeout, server hostB not responding. (the host is down or the "
        "network to it is cut)")


def test_exit_code_255_otherwise_is_a_broken_session(fake_ssh):
    fake_ssh("Connection closed by 10.0.0.2 port 22", 255)
    group = start()
    assert not group.lost_contact()
    assert group.describe_end("worker w2") == (
        "worker w2 on host hostB ended without a report (ssh exit code 255: it was killed, or its ssh "
        "session broke: Connection closed by 10.0.0.2 port 22)")


def test_another_exit_code_is_the_remote_commands_own(fake_ssh):
    fake_ssh("", 1)
    group = start()
    assert not group.unreachable()
    assert group.describe_end("the agent of node 1") == "the agent of node 1 (ssh) ended without a report"
