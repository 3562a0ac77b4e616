"""ringtrain under a real Slurm: ranks come from srun's variables, batch scripts run with sbatch."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.integration.slurm import SlurmCluster
from tests.integration.system import (
    ringtrain_argv,
    script_interpreter_flags,
)

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("allreduce_script.py")
REPORT_ENV = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "report_env.py"


def test_srun_check_takes_ranks_from_slurm(slurm_cluster: SlurmCluster) -> None:
    result = slurm_cluster.run(["srun", "-n", "2", *ringtrain_argv("check", "--sizes", "4K,64K",
                                                                    "--iterations", "2", "--timeout", "240")],
                               timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"hello from rank {rank} of 2 (host {slurm_cluster.host}, local rank {rank}," in result.stdout
    assert "environment: slurm, 2 rank(s)" in result.stdout
    assert "all checks passed on 2 rank(s)" in result.stdout


def test_generated_slurm_script_runs_with_sbatch(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    generated = slurm_cluster.run(
        ringtrain_argv("script", "slurm", "--nodes", "1", "--procs-per-node", "2",
                       *script_interpreter_flags(), "--", sys.executable, str(SCRIPT)), timeout=60)
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


def test_a_batch_job_over_nodes_relaunches_through_srun_with_the_config(slurm_cluster: SlurmCluster,
                                                                         tmp_path: Path) -> None:
    """What `ringtrain run` does in a batch script spanning several nodes: srun starts one agent per node,
    handing it the LaunchConfig as JSON. The test cluster has one node, so the plan is made by hand
    (srun allocates the node itself); the tasks' half is real: srun, node_entry, the agent, the ranks."""
    code = (
        "import sys\n"
        "from ringtrain.launch.config import LaunchConfig\n"
        "from ringtrain.launch.driver import relaunch_with_srun\n"
        "from ringtrain.launch.plan import SrunPlan\n"
        f"config = LaunchConfig(command=(sys.executable, {str(REPORT_ENV)!r}, {str(tmp_path)!r}),\n"
        "                      num_proc=5, tuning={'HOROVOD_CYCLE_TIME': '3'}, verbose=True)\n"
        "sys.exit(relaunch_with_srun(config, SrunPlan(nnodes=1, nproc_per_node=2)))\n")
    result = slurm_cluster.run([sys.executable, "-c", code], timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ringtrain.launch.node_entry" in result.stderr  # --verbose shows the srun command line
    ranks = {int(p.stem): json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(ranks) == [0, 1]  # the plan's two ranks per node win over num_proc
    for rank, env in ranks.items():
        assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"]) == (str(rank), "2")
        assert env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_CYCLE_TIME"] == "3"  # the config's tuning reached the workers through the hop


#: Job scripts the tests write, each to pass ``sbatch --test-only`` (Slurm's own check of a script).
SCRIPT_VARIANTS = [
    [],
    ["--time", "01:30:00", "--partition", "test", "--job-name", "variant", "--output", "v-%j.log"],
    ["--time", "30:00:00", "--qos", "normal", "--account", "proj7", "--mail-user", "me@example.org",
     "--mail-type", "all"],
    ["--cpus-per-proc", "2", "--setup", "echo set up", "--venv", "/opt/some venv"],
    ["--gpus-per-node", "2", "--python", "/usr/bin/python3", "--mail-type", "fail"],
    ["--requeue", "--signal-before", "300", "--time", "01:00:00"],
]


@pytest.mark.parametrize("flags", SCRIPT_VARIANTS, ids=lambda flags: " ".join(flags[:2]) or "defaults")
def test_every_generated_script_passes_sbatch_test_only(slurm_cluster: SlurmCluster, flags: list[str],
                                                         tmp_path: Path) -> None:
    argv = ringtrain_argv("script", "slurm", "-N", "1", "--nproc-per-node", "2", *flags, "--", "python3",
                          "train.py")
    generated = slurm_cluster.run(argv, timeout=60)
    assert generated.returncode == 0, generated.stderr
    job = tmp_path / "job.sh"
    job.write_text(generated.stdout)
    result = slurm_cluster.run(["sbatch", "--test-only", str(job)], timeout=60, cwd=tmp_path)
    assert result.returncode == 0, f"{result.stderr}\n--- job.sh:\n{generated.stdout}"
    assert f"on nodes {slurm_cluster.host}" in result.stderr


def test_sigusr1_to_the_launcher_in_a_batch_job_reaches_the_ranks_through_srun(slurm_cluster: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """A scheduler's warning to ``ringtrain run`` inside a batch job: the launcher passes it to its srun
    step, srun to its tasks (the node agents), each agent to its ranks; they exit 75 and so does the job."""
    warned = ("import os, signal, sys, time\n"
              "def warned(signum, frame):\n"
              "    open(os.path.join(sys.argv[1], 'rank' + os.environ['RANK']), 'w').write(str(signum))\n"
              "    sys.exit(75)\n"
              "signal.signal(signal.SIGUSR1, warned)\n"
              "open(os.path.join(sys.argv[1], 'ready' + os.environ['RANK']), 'w').close()\n"
              "time.sleep(300)\n")
    code = (
        "import os, signal, sys, threading, time\n"
        "from ringtrain.launch.config import LaunchConfig\n"
        "from ringtrain.launch.driver import relaunch_with_srun\n"
        "from ringtrain.launch.plan import SrunPlan\n"
        "def warn():\n"
        "    while len([n for n in os.listdir('.') if n.startswith('ready')]) < 2:\n"
        "        time.sleep(0.1)\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "threading.Thread(target=warn, daemon=True).start()\n"
        f"config = LaunchConfig(command=(sys.executable, '-c', {warned!r}, {str(tmp_path)!r}))\n"
        "sys.exit(relaunch_with_srun(config, SrunPlan(nnodes=1, nproc_per_node=2)))\n")
    result = slurm_cluster.run([sys.executable, "-c", code], timeout=300, cwd=tmp_path)
    assert result.returncode == 75, result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"], result.stderr
    assert "stopped on request with exit status 75" in result.stderr
