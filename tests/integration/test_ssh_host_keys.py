"""ssh checks the hosts' keys (launch/remote.py): the real OpenSSH client and sshd of the namespace hosts.

Each test gives ssh a known_hosts file of its own through an ``ssh`` first on PATH that adds
``-o UserKnownHostsFile=FILE`` (options on the command line come before every config file), so the
session's shared known_hosts stays as it is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, clean_env, ringtrain_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROBE = ("from ringtrain.launch.remote import probe_hosts; probe_hosts(['hostB'], None, None, 30); "
         "print('reached')")


def _ssh_with(known_hosts: Path, folder: Path) -> dict[str, str]:
    """An environment whose ``ssh`` reads ``known_hosts`` (and records new keys there)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    real = shutil.which("ssh")
    assert real is not None
    (bin_dir / "ssh").write_text(f'#!/bin/sh\nexec {real} -o UserKnownHostsFile={known_hosts} "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    return {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{clean_env()['PATH']}"}


def _real_key(hosts: NamespaceHosts, name: str) -> str:
    lines = (hosts.root / "known_hosts").read_text().splitlines()
    (line,) = [ln for ln in lines if ln.startswith(name + ",")]
    return " ".join(line.split()[1:3])


def test_a_host_answering_with_another_key_gets_no_job_and_the_user_gets_the_host_and_the_fix(
        netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    known = tmp_path / "known_hosts"
    public = impostor.with_suffix(".pub").read_text().split()
    known.write_text(f"hostB {public[0]} {public[1]}\n")  # what the user trusted for hostB before
    marker = tmp_path / "ran-on-hostB"
    result = netns_hosts.run("hostA", ringtrain_argv("run", "-H", "hostA:1,hostB:1", "python", "-c",
                                                     f"open({str(marker)!r}, 'w').close()"),
                             timeout=300, env=_ssh_with(known, tmp_path), cwd=ROOT)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "host hostB: ssh refused its host key (Host key verification failed)" in result.stderr
    assert "ssh-keygen -R hostB" in result.stderr
    assert "Traceback" not in result.stderr
    assert not marker.exists()  # nothing ran anywhere: the probe comes before any agent


def test_a_first_contact_is_trusted_and_recorded_by_default_and_refused_under_yes(
        netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    env = _ssh_with(known, tmp_path)
    strict = netns_hosts.run("hostA", [sys.executable, "-c", PROBE], timeout=120,
                             env={**env, "RINGTRAIN_SSH_HOST_KEY_CHECKING": "yes"})
    assert strict.returncode != 0
    assert "host hostB: its key is not in your known_hosts and RINGTRAIN_SSH_HOST_KEY_CHECKING=yes" \
        in strict.stderr, strict.stderr
    assert known.read_text() == ""
    first = netns_hosts.run("hostA", [sys.executable, "-c", PROBE], timeout=120, env=env)
    assert first.returncode == 0, first.stderr
    assert "reached" in first.stdout
    assert _real_key(netns_hosts, "hostB") in known.read_text()  # recorded: a later change is refused
