"""The test infrastructure itself works: jobs run under Slurm, hosts reach each other over ssh.

These need no ringtrain collectives, so they tell a broken fixture apart from a broken library.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.slurm import SLOTS, SlurmCluster

pytestmark = pytest.mark.integration


def test_srun_starts_one_task_per_slot_with_slurm_ranks(slurm_cluster: SlurmCluster) -> None:
    result = slurm_cluster.run(["srun", "-n", str(SLOTS), "sh", "-c",
                                'echo "$SLURM_PROCID/$SLURM_NTASKS local=$SLURM_LOCALID node=$SLURM_NODEID"'],
                               timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"{r}/{SLOTS} local={r} node=0" for r in range(SLOTS))


def test_sbatch_wait_returns_the_job_exit_code(slurm_cluster: SlurmCluster, tmp_path) -> None:
    script = tmp_path / "fails.sh"
    script.write_text("#!/bin/sh\necho about to fail\nexit 7\n")
    result = slurm_cluster.run(["sbatch", "--wait", "-o", str(tmp_path / "out.txt"), str(script)],
                               timeout=120)
    assert result.returncode != 0
    assert (tmp_path / "out.txt").read_text().strip() == "about to fail"


def test_hosts_have_their_own_names_and_reach_each_other_over_ssh(netns_hosts: NamespaceHosts) -> None:
    for src, dst in (("hostA", "hostB"), ("hostB", "hostA")):
        result = netns_hosts.ssh(src, dst, "hostname; cat /proc/self/net/dev")
        assert result.returncode == 0, result.stderr
        name, *dev = result.stdout.splitlines()
        assert name == dst
        # The remote shell lives in the other namespace: it sees that host's end of the link.
        assert any(netns_hosts.hosts[dst].interface in line for line in dev)


def test_link_is_rate_limited_by_tbf(netns_hosts: NamespaceHosts) -> None:
    result = netns_hosts.run("hostA", ["tc", "qdisc", "show", "dev", netns_hosts.hosts["hostA"].interface])
    assert result.returncode == 0, result.stderr
    assert re.search(r"tbf .*rate 1Gbit", result.stdout), result.stdout


@pytest.mark.parametrize("name", ["hostDown", "hostSilent"])
def test_dead_host_names_resolve_but_do_not_answer(netns_hosts: NamespaceHosts, name: str) -> None:
    # ARP gives up after about 3 s for hostDown; hostSilent never answers, so a short timeout ends it.
    timeout = 20 if name == "hostDown" else 3
    resolved = netns_hosts.run("hostA", ["getent", "hosts", name], timeout=30)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    argv = ["ssh", "-o", f"ConnectTimeout={timeout}", "-o", "BatchMode=yes", f"root@{name}", "true"]
    result = netns_hosts.run("hostA", argv, timeout=60)
    if result.returncode == 255 and not result.stderr:
        # Seen once in CI: ssh failed without a word (cause unknown, not reproduced in 11 local runs).
        # The second attempt must say why it failed.
        result = netns_hosts.run("hostA", argv, timeout=60)
    assert result.returncode == 255
    assert "Could not resolve" not in result.stderr
    expected = "No route to host" if name == "hostDown" else "timed out"
    assert expected in result.stderr, result.stderr
