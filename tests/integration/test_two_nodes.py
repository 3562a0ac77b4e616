"""Two nodes for real: hostA and hostB (network namespaces, each with sshd and its own slurmd).

The ways a user's platform hands out two machines, each checked end to end: a job script from
``ringtrain script slurm -N 2`` under ``sbatch --wait``; ``srun -N 2 ringtrain run``; ``mpirun -H``
across the hosts; and the tutorial's ``horovodrun -np N -H host:slots,...`` line after
``ringtrain install-aliases``. Each time 2 ranks on the 2 hosts allreduce and agree, and each rank says
on which host it ran.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.slurm import SlurmCluster
from tests.integration.system import (
    ROOT,
    clean_env,
    ringtrain_argv,
    script_interpreter_flags,
    skip_unless_commands,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("allreduce_script.py")
_RANK = re.compile(r"rank (\d+) of (\d+) local (\d+) env (\S+) sum (-?\d+) host (\S+)")


def _ranks(output: str) -> list[tuple[str, ...]]:
    return sorted(_RANK.findall(output))


def _agreed(env: str) -> list[tuple[str, ...]]:
    """What the two ranks print when they met: one per host, and the sum 0 + 1."""
    return [("0", "2", "0", env, "1", "hostA"), ("1", "2", "0", env, "1", "hostB")]


def test_generated_slurm_script_runs_on_two_nodes(slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    generated = slurm_two_nodes.run(ringtrain_argv("script", "slurm", "-N", "2", "--nproc-per-node", "1",
                                                   *script_interpreter_flags(), "--", "python3", str(SCRIPT)),
                                    timeout=60)
    assert generated.returncode == 0, generated.stderr
    job = tmp_path / "job.sh"
    job.write_text(generated.stdout)
    checked = slurm_two_nodes.run(["sbatch", "--test-only", str(job)], timeout=60, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "on nodes hostA,hostB" in checked.stderr
    output = tmp_path / "job.out"
    result = slurm_two_nodes.run(["sbatch", "--wait", "-o", str(output), str(job)], timeout=400, cwd=tmp_path)
    log = output.read_text() if output.exists() else "(no output file)"
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n--- job.sh:\n{job.read_text()}\n{log}"
    assert _ranks(log) == _agreed("ringtrain-run"), log


def test_srun_starts_one_ringtrain_run_per_node(slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    result = slurm_two_nodes.run(["srun", "-N", "2", *ringtrain_argv("run", "--nproc-per-node", "1", "python",
                                                                     str(SCRIPT))], timeout=400, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _ranks(result.stdout) == _agreed("ringtrain-run"), result.stdout


def test_mpirun_hands_out_the_two_hosts(netns_hosts: NamespaceHosts) -> None:
    skip_unless_commands("mpirun.openmpi")
    # The platform-hands-out-hosts tutorial: mpirun -np 2 -H host1,host2 python train.py (root needs the
    # two OMPI_ALLOW variables; the ranks find node 0 from mpirun's own address).
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    result = netns_hosts.run("hostA", ["mpirun.openmpi", "-np", "2", "-H", "hostA,hostB", "--bind-to", "none",
                                       "-x", "OMP_NUM_THREADS=1", sys.executable, str(SCRIPT)],
                             timeout=400, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _ranks(result.stdout) == _agreed("openmpi"), result.stdout


def test_horovodrun_line_across_two_hosts(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    installed = netns_hosts.run("hostA", ringtrain_argv("install-aliases", "--dir", str(bin_dir)),
                                timeout=120)
    assert installed.returncode == 0, installed.stderr
    path = f"{bin_dir}:{Path(sys.executable).parent}:{clean_env()['PATH']}"
    # The tutorial's line as it is, with the hosts of this test (ssh keys are set up, as on a cluster).
    result = netns_hosts.run("hostA", ["sh", "-c", f"horovodrun -np 2 -H hostA:1,hostB:1 python {SCRIPT}"],
                             timeout=400, env={"PATH": path}, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _ranks(result.stdout) == _agreed("ringtrain-run"), result.stdout


def test_x_passes_the_launchers_variable_to_the_other_host(netns_hosts: NamespaceHosts) -> None:
    # Only a few variables travel to other hosts by themselves; -x NAME adds one, with the launcher's value.
    show = "import os, socket; print('seen', socket.gethostname(), os.environ.get('RT_FROM_LAUNCHER'))"
    argv = ringtrain_argv("run", "-np", "2", "-H", "hostA:1,hostB:1", "-x", "RT_FROM_LAUNCHER", "python",
                          "-c", show)
    result = netns_hosts.run("hostA", argv, timeout=400, env={"RT_FROM_LAUNCHER": "from hostA"}, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"seen (\w+) (.+)", result.stdout)) == [("hostA", "from hostA"),
                                                                    ("hostB", "from hostA")], result.stdout
