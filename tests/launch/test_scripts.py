"""Job scripts (``ringtrain.launch.scripts``): CPUs and threads per rank, PBS's ranks under pbsdsh, the
rendezvous port. The command line's side, and the scripts run as PBS and LSF would, are in
tests/cli/test_script.py; Slurm's ``sbatch --test-only`` and ``--wait`` in tests/integration/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtrain.launch.scripts import JobScript, render
from tests.cli.test_script import FAKE_PBSDSH, REPORT_ENV


def _job(scheduler: str, **options: object) -> JobScript:
    options.setdefault("command", ("python3", "train.py"))
    return JobScript(scheduler=scheduler, nodes=2, procs_per_node=4, **options)  # type: ignore[arg-type]


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


# --- --requeue -----------------------------------------------------------------------------------------

_TRAIN = ("python3", "-m", "ringtrain", "train", "mnist", "--snapshot-dir", "snaps")


def test_requeue_asks_each_scheduler_for_its_warning_and_a_rerunnable_job() -> None:
    slurm = render(_job("slurm", command=_TRAIN, requeue=True)).splitlines()
    assert {"#SBATCH --requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --open-mode=append"} <= set(slurm)
    assert "#SBATCH --signal=B:USR1@300" in render(_job("slurm", command=_TRAIN, requeue=True,
                                                        signal_before=300)).splitlines()
    assert "#PBS -r y" in render(_job("pbs", command=_TRAIN, requeue=True)).splitlines()
    lsf = render(_job("lsf", command=_TRAIN, requeue=True, signal_before=90)).splitlines()
    assert {"#BSUB -r", "#BSUB -wa USR1", "#BSUB -wt 00:02"} <= set(lsf)  # LSF's minutes, rounded up
    for scheduler in ("slurm", "pbs", "lsf"):
        plain = render(_job(scheduler, command=_TRAIN))
        assert "requeue" not in plain
        assert "qrerun" not in plain
        assert "USR1" not in plain
        # the launch stays in the foreground without --requeue: its status is the job's as before
        assert "LAUNCH_PID" not in plain


@pytest.mark.parametrize(("options", "message"), [
    ({"command": ("python3", "-m", "ringtrain", "train", "mnist")}, "writes no snapshot"),
    ({"command": ("ringtrain", "train", "mnist", "--snapshot-dir", "s", "--no-resume")}, "--no-resume"),
    ({"command": _TRAIN, "signal_before": 0}, "--signal-before 0 must be at least 1"),
    ({"command": _TRAIN, "time": "00:02:00"}, "--signal-before 120 is not shorter than --time 00:02:00"),
])
def test_requeue_refuses_a_run_that_could_not_resume(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        _job("slurm", requeue=True, **options)
    assert "HINT" in str(caught.value)
    # --save-every gives `ringtrain train` its default snapshot folder, in the job's working folder
    _job("slurm", requeue=True, command=("ringtrain", "train", "mnist", "--save-every-steps", "50"))
    _job("slurm", requeue=True, command=("python3", "my_train.py"))  # another program: its own business


#: Stands in for the job's interpreter: real Python for the script's own uses (the import check, the
#: port, the secret), and for ``-m ringtrain run`` a launch that ends as ``FAKE_RUN`` says: ``exit:N``,
#: or ``warned``: wait for the warning (SIGUSR1, or PBS's SIGTERM), then end preempted as ranks would.
FAKE_PYTHON = """#!/bin/bash
if [ "$1 $2 $3" != "-m ringtrain run" ]; then exec "$REAL_PYTHON" "$@"; fi
case "$FAKE_RUN" in
    exit:*) exit "${FAKE_RUN#exit:}" ;;
    warned)
        trap 'echo "launch got the warning" >> "$FAKE_LOG"; exit 75' USR1 TERM
        touch "$FAKE_READY"
        while :; do sleep 0.05; done ;;
esac
"""
#: srun, scontrol and each scheduler's requeue command, recording how they were called.
FAKE_SRUN = '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n'
FAKE_SCONTROL = ('#!/bin/bash\nif [ "$1" = show ]; then echo localhost; exit 0; fi\n'
                 'echo "scontrol $*" >> "$FAKE_LOG"\nexit "${REQUEUE_STATUS:-0}"\n')
FAKE_REQUEUE = '#!/bin/bash\necho "$(basename "$0") $*" >> "$FAKE_LOG"\nexit "${REQUEUE_STATUS:-0}"\n'
_JOB_ENV = {"slurm": {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_CPUS_ON_NODE": "2",
                      "SLURM_CPUS_PER_TASK": "1"},
            "pbs": {"PBS_JOBID": "4242.pbs01"}, "lsf": {"LSB_JOBID": "4242"}}
_REQUEUED = {"slurm": "scontrol requeue 4242", "pbs": "qrerun 4242.pbs01", "lsf": "brequeue 4242"}


def _start_requeue_job(scheduler: str, tmp_path: Path, fake_run: str,
                       requeue_status: int = 0) -> subprocess.Popen[str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True)
    for name, text in (("python3", FAKE_PYTHON), ("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL),
                       ("qrerun", FAKE_REQUEUE), ("brequeue", FAKE_REQUEUE), ("pbsdsh", FAKE_PBSDSH)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n")
    script = tmp_path / "job.sh"
    script.write_text(render(JobScript(scheduler=scheduler, nodes=1, procs_per_node=1, command=_TRAIN,
                                       requeue=True, cpus_per_proc=1)))
    env = {"PATH": f"{fake_bin}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path),
           "REAL_PYTHON": sys.executable, "FAKE_RUN": fake_run, "FAKE_LOG": str(tmp_path / "calls.log"),
           "FAKE_READY": str(tmp_path / "ready"), "REQUEUE_STATUS": str(requeue_status),
           "PYTHONPATH": os.pathsep.join(sys.path), "PBS_NODEFILE": str(hostfile),
           "PBS_O_WORKDIR": str(tmp_path), "LSB_DJOB_HOSTFILE": str(hostfile),
           "PBSDSH_LOG": str(tmp_path / "pbsdsh.log"), **_JOB_ENV[scheduler]}
    return subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.slow  # six job scripts run: about 3 s
@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "lsf"])
def test_requeue_trap_requeues_the_job_only_when_the_launch_ended_preempted(scheduler: str,
                                                                             tmp_path: Path) -> None:
    preempted = _start_requeue_job(scheduler, tmp_path / "75", "exit:75")
    _, stderr = preempted.communicate(timeout=120)
    assert preempted.returncode == 0, stderr  # requeued: not a failure
    assert _calls(tmp_path / "75") == [_REQUEUED[scheduler]]
    assert "ringtrain run ended preempted (status 75" in stderr
    failed = _start_requeue_job(scheduler, tmp_path / "1", "exit:1")
    _, stderr = failed.communicate(timeout=120)
    assert failed.returncode == 1, stderr  # any other status is the job's own
    assert _calls(tmp_path / "1") == []


def test_a_refused_requeue_says_so_and_ends_preempted(tmp_path: Path) -> None:
    job = _start_requeue_job("slurm", tmp_path, "exit:75", requeue_status=1)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 75
    assert "scontrol requeue $SLURM_JOB_ID failed" not in stderr  # the script names the job's number
    assert "scontrol requeue 4242 failed: submit the same script again to resume" in stderr


@pytest.mark.slow
@pytest.mark.parametrize(("scheduler", "warning"), [("slurm", signal.SIGUSR1), ("lsf", signal.SIGUSR1),
                                                    ("pbs", signal.SIGTERM)])
def test_the_warning_to_the_batch_shell_reaches_the_launch_and_the_job_is_requeued(
        scheduler: str, warning: signal.Signals, tmp_path: Path) -> None:
    """Slurm's ``--signal=B:USR1@N`` and LSF's ``-wa USR1`` warn the batch shell, which passes the
    warning on; PBS sends SIGTERM to every process of the job, the batch shell included, which must
    live through it and wait for the ranks."""
    job = _start_requeue_job(scheduler, tmp_path, "warned")
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists():  # the launch has started (an event, polled)
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "the launch did not start"
            time.sleep(0.05)
        os.kill(job.pid, warning)
        if scheduler == "pbs":  # PBS signals the whole job: the launch too
            for line in subprocess.run(["pgrep", "-f", f"{tmp_path}/bin/python3 -m ringtrain run"],
                                       capture_output=True, text=True).stdout.split():
                os.kill(int(line), warning)
        _, stderr = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr
    assert _calls(tmp_path) == ["launch got the warning", _REQUEUED[scheduler]], stderr
