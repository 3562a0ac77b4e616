"""Job scripts (``ringtrain.launch.scripts``): CPUs and threads per rank, PBS's ranks under pbsdsh, the
rendezvous port. The command line's side, and the scripts run as PBS and LSF would, are in
tests/cli/test_script.py; Slurm's ``sbatch --test-only`` and ``--wait`` in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.launch.scripts import JobScript, render
from tests.cli.test_script import FAKE_PBSDSH, REPORT_ENV


def _job(scheduler: str, **options: object) -> JobScript:
    return JobScript(scheduler=scheduler, nodes=2, procs_per_node=4, command=("python3", "train.py"),
                     **options)  # type: ignore[arg-type]


def _threads(text: str, environ: dict[str, str]) -> str:
    """What the script's ``OMP_NUM_THREADS`` line exports, run with ``environ``."""
    (line,) = [line for line in text.splitlines() if line.startswith("export OMP_NUM_THREADS=")]
    result = subprocess.run(["bash", "-c", f"set -u; {line}; echo $OMP_NUM_THREADS"], env=environ,
                            capture_output=True, text=True, check=True)
    return result.stdout.strip()


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "lsf"])
def test_threads_are_always_exported(scheduler: str) -> None:
    given = render(_job(scheduler, cpus_per_proc=3))
    assert "export OMP_NUM_THREADS=3  # --cpus-per-proc cores for each rank" in given.splitlines()
    default = render(_job(scheduler))
    assert sum(line.startswith("export OMP_NUM_THREADS=") for line in default.splitlines()) == 1


def test_slurm_takes_whole_nodes_and_shares_their_cores_by_default() -> None:
    text = render(_job("slurm"))
    lines = text.splitlines()
    assert "#SBATCH --exclusive" in lines
    assert not [line for line in lines if line.startswith("#SBATCH --cpus-per-task")]
    assert 'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 \\' in lines
    # the node's CPUs as Slurm counts them, over the node's 4 ranks; never below one thread
    assert _threads(text, {"SLURM_CPUS_ON_NODE": "64"}) == "16"
    assert _threads(text, {"SLURM_CPUS_ON_NODE": "6"}) == "1"
    assert _threads(text, {"SLURM_CPUS_ON_NODE": "2"}) == "1"
    # --cpus-per-proc: shares the node, requests exactly that, no --exclusive
    given = render(_job("slurm", cpus_per_proc=2)).splitlines()
    assert "#SBATCH --cpus-per-task=8" in given
    assert "#SBATCH --exclusive" not in given


def test_pbs_and_lsf_take_whole_hosts_by_default() -> None:
    pbs = render(_job("pbs")).splitlines()
    assert "#PBS -l select=2:ncpus=4:mpiprocs=4" in pbs
    assert "#PBS -l place=scatter:excl" in pbs
    torque = render(_job("pbs", pbs_resources="nodes")).splitlines()
    assert "#PBS -l nodes=2:ppn=4" in torque
    assert "#PBS -n" in torque
    lsf = render(_job("lsf")).splitlines()
    assert lsf[2:5] == ["#BSUB -n 2", '#BSUB -R "span[ptile=1]"', "#BSUB -x"]
    # the cores each host grants the job (nproc), over its ranks
    assert _threads(render(_job("lsf")), {"PATH": os.environ["PATH"]}) == str(
        max(1, len(os.sched_getaffinity(0)) // 4))
    with_cpus = render(_job("pbs", cpus_per_proc=2)).splitlines()
    assert "#PBS -l select=2:ncpus=8:mpiprocs=4" in with_cpus
    assert "#PBS -l place=scatter" in with_cpus


def test_pbs_never_reaches_nodes_over_ssh_nor_by_this_machines_path() -> None:
    text = render(_job("pbs"))
    assert "pbsdsh -n" in text
    assert "ssh" not in text.replace("no ssh", "")
    assert sys.executable not in text
    # every `ringtrain run` of a PBS job is one node's, with its node rank: none spreads itself over ssh
    runs = [line for line in text.splitlines() if "-m ringtrain run" in line]
    assert runs
    assert all('--node-rank "$1"' in line for line in runs)


def test_the_rendezvous_port_is_picked_free_not_derived_from_the_job_number() -> None:
    text = render(_job("slurm"))
    (line,) = [line for line in text.splitlines() if line.startswith("MASTER_PORT=")]
    # two jobs whose numbers are 10000 apart: 15000 + the last four digits gave both 16234
    ports = [subprocess.run(["bash", "-c", f"{line}; echo $MASTER_PORT"], capture_output=True, text=True,
                            check=True, env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": job}).stdout.strip()
             for job in ("11234", "21234")]
    assert all(0 < int(port) < 65536 for port in ports)
    assert "16234" not in ports
    assert "15000" not in text


def test_a_missing_pbsdsh_is_named_with_the_fix(tmp_path: Path) -> None:
    text = render(JobScript(scheduler="pbs", nodes=1, procs_per_node=1, command=("true",),
                            python=sys.executable))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n")
    env = {"PATH": "/usr/bin:/bin", "PBS_JOBID": "7.pbs", "PBS_NODEFILE": str(hostfile),
           "PBS_O_WORKDIR": str(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", "-c", text], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "job: pbsdsh not found" in result.stderr
    assert "HINT" in result.stderr


@pytest.mark.slow
def test_a_two_host_pbs_job_starts_one_agent_per_host_with_its_node_rank(tmp_path: Path) -> None:
    """Two host names of this machine in the node file: pbsdsh starts one `ringtrain run` for each, node
    ranks 0 and 1, which meet at the first host and start one rank each."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\nlocalhost\n127.0.0.1\n127.0.0.1\n")
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(render(JobScript(scheduler="pbs", nodes=2, procs_per_node=1, cpus_per_proc=1,
                                       command=("python3", str(REPORT_ENV), str(out)))))
    fake_bin = tmp_path / "pbs-bin"
    fake_bin.mkdir()
    (fake_bin / "pbsdsh").write_text(FAKE_PBSDSH)
    (fake_bin / "pbsdsh").chmod(0o755)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{fake_bin}{os.pathsep}"
           f"{os.environ['PATH']}", "PBS_JOBID": "8813.pbs01", "PBS_NODEFILE": str(hostfile),
           "PBS_O_WORKDIR": str(tmp_path), "PBSDSH_LOG": str(tmp_path / "pbsdsh.log"),
           "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("RINGTRAIN_JOB_SECRET", None)
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted((tmp_path / "pbsdsh.log").read_text().split()) == ["0", "2"]  # each host's first line
    ranks = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(ranks) == [0, 1]
    assert {r["WORLD_SIZE"] for r in ranks.values()} == {"2"}
    assert {r["GROUP_RANK"] for r in ranks.values()} == {"0", "1"}  # torchrun's node rank
    assert len({r["RINGTRAIN_JOB_SECRET"] for r in ranks.values()}) == 1
    assert {r["OMP_NUM_THREADS"] for r in ranks.values()} == {"1"}
