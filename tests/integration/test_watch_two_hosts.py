"""The watch across two namespace hosts (``ringtrain run -H hostA:1,hostB:1`` over ssh): the driver
decides over both hosts' ranks, from what each host's agent sends it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, ringtrain_argv

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPTS = ROOT / "tests" / "watch" / "scripts"
STUCK = SCRIPTS / "stuck.py"
STUCK_LINE = next(n for n, line in enumerate(STUCK.read_text().splitlines(), 1) if "# the stuck line" in line)


def run_two_hosts(hosts: NamespaceHosts, *command: str, flags: tuple[str, ...] = ()):
    argv = ringtrain_argv("run", "-np", "2", "-H", "hostA:1,hostB:1", "-i", str(hosts.key),
                          "--start-timeout", "120", *flags, sys.executable, *command)
    return hosts.run("hostA", argv, timeout=300, cwd=ROOT)


def test_a_rank_blocked_on_the_other_host_is_named_with_its_host_and_line(netns_hosts: NamespaceHosts):
    result = run_two_hosts(netns_hosts, str(STUCK), "block", flags=("--hang-timeout", "4"))
    err = result.stderr
    assert result.returncode == 1, err
    assert "the job waits for rank 1:" in err
    assert "rank 1 on hostB" in err
    assert f"{STUCK}:{STUCK_LINE} in get_stuck" in err
    assert "rank 0 waits in all_reduce #" in err
    root = err.split("Root cause")[1]
    assert "host       : hostB" in root
    assert "rank       : 1" in root
    assert "stuck, ended by the watch" in root
    assert "threading.Event().wait()" in root  # rank 1's main thread, taken on hostB
    stacks = Path(err.split("every rank's stacks: ")[1].splitlines()[0]).read_text()
    assert "=== host hostB: every thread of its ranks in " in stacks
    assert "@@RINGTRAIN_WATCH@@" not in result.stdout + err, "the agents' lines are the driver's"


def test_a_slow_rank_on_the_other_host_is_named(netns_hosts: NamespaceHosts):
    result = run_two_hosts(netns_hosts, str(SCRIPTS / "slow_rank.py"), "150", "ddp")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "is the slowest" in line]
    assert lines, result.stderr
    assert lines[0].startswith("ringtrain run: rank 1 on hostB is the slowest")
    assert lines[-1].startswith("ringtrain run: over the whole run, rank 1 on hostB")


@pytest.mark.parametrize("trial", range(3))
def test_a_horovod_rank_that_raises_on_the_other_host_is_the_root_cause(netns_hosts: NamespaceHosts, trial):
    """Rank 1 raises on hostB, then exits slowly: rank 0's "Horovod has been shut down" on hostA comes
    first in time and is reported first, yet it is the consequence (tests/launch/scripts/hvd_raise.py)."""
    result = run_two_hosts(netns_hosts, str(ROOT / "tests" / "launch" / "scripts" / "hvd_raise.py"))
    err = result.stderr
    assert result.returncode == 1, err
    root = err.split("Root cause")[1]
    assert "host       : hostB" in root
    assert "rank       : 1" in root
    assert "RuntimeError: boom at step 5" in root
    assert 'raise RuntimeError("boom at step 5")' in root  # its traceback
