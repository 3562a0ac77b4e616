"""ringtrain under a real Slurm: ranks come from srun's variables, batch scripts run with sbatch."""

from __future__ import annotations

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


@pytest.mark.slow
def test_srun_four_tasks_oversubscribed_allreduce(slurm_cluster: SlurmCluster) -> None:
    skip_unless_collectives()
    result = slurm_cluster.run(["srun", "-n", "4", sys.executable, str(SCRIPT)], timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {r} of 4 local {r} env slurm sum 6" for r in range(4)], result.stdout


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
    lines = sorted(line for line in log.splitlines() if line.startswith("rank "))
    assert lines == [f"rank {r} of 2 local {r} env slurm sum 1" for r in range(2)], log
