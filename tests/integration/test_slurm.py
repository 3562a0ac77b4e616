"""ringtrain under a real Slurm: ranks come from srun's variables, batch scripts run with sbatch."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.integration.slurm import SlurmCluster
from tests.integration.system import ringtrain_argv, ringtrain_has_command, skip_unless_collectives

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("allreduce_script.py")


def test_srun_check_takes_ranks_from_slurm(slurm_cluster: SlurmCluster) -> None:
    skip_unless_collectives()
    result = slurm_cluster.run(["srun", "-n", "2", *ringtrain_argv("check", "--sizes", "4K,64K",
                                                                    "--iterations", "2", "--timeout", "240")],
                               timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"hello from rank {rank} of 2 (host {slurm_cluster.host}, local rank {rank}," in result.stdout
    assert "environment: slurm, 2 rank(s)" in result.stdout
    assert "all checks passed on 2 rank(s)" in result.stdout


def test_generated_slurm_script_runs_with_sbatch(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    if not ringtrain_has_command("script"):
        pytest.skip("`ringtrain script` is not registered yet (ringtrain.cli.script)")
    skip_unless_collectives()
    generated = slurm_cluster.run(
        ringtrain_argv("script", "slurm", "--nodes", "1", "--procs-per-node", "2", "--",
                       sys.executable, str(SCRIPT)), timeout=60)
    assert generated.returncode == 0, generated.stderr
    job = tmp_path / "job.sh"
    job.write_text(generated.stdout)
    output = tmp_path / "job.out"
    result = slurm_cluster.run(["sbatch", "--wait", "-o", str(output), str(job)], timeout=300, cwd=tmp_path)
    log = output.read_text() if output.exists() else "(no output file)"
    assert result.returncode == 0, (f"{result.stdout}{result.stderr}\n--- job.sh:\n{job.read_text()}"
                                    f"\n--- job.out:\n{log}")
    # The script may start ranks directly with srun or through `ringtrain run` on each node (then the
    # ranks see torchrun's variables and lines may carry a rank prefix): either way there must be two
    # ranks that reduced correctly.
    found = sorted(re.findall(r"rank (\d+) of (\d+) local (\d+) env \S+ sum (\d+)", log))
    assert found == [("0", "2", "0", "1"), ("1", "2", "1", "1")], log
