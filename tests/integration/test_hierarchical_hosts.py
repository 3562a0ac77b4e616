"""``ringtrain run --hierarchical-allreduce --hierarchical-allgather`` on two namespace hosts, two ranks
each: only one rank per host sends across the 1 Gbit/s link, and the results are right."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, ringtrain_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("hierarchical_script.py")


def test_hierarchical_collectives_across_two_hosts(netns_hosts: NamespaceHosts) -> None:
    argv = ringtrain_argv("run", "-np", "4", "-H", "hostA:2,hostB:2", "-i", str(netns_hosts.key),
                          "--start-timeout", "120", "--hierarchical-allreduce", "--hierarchical-allgather",
                          sys.executable, str(SCRIPT))
    result = netns_hosts.run("hostA", argv, timeout=540, cwd=ROOT)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    pattern = r"rank (\d) host (\w+) hosts (\[\[.*?\]\]) root (yes|no) runs (\d+) (\w+)"
    lines = sorted(re.findall(pattern, output))
    assert [(r, host, root, status) for r, host, _, root, _, status in lines] == [
        ("0", "hostA", "yes", "ok"), ("1", "hostA", "no", "ok"), ("2", "hostB", "yes", "ok"),
        ("3", "hostB", "no", "ok")], output
    assert {hosts for _, _, hosts, _, _, _ in lines} == {"[[0, 1], [2, 3]]"}
    assert all(int(runs) == 4 for *_, runs, _ in lines), output  # all four collectives went by host
