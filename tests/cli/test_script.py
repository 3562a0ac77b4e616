"""``ringtrain script slurm|pbs|lsf``: the job script's structure, options, and bad input (exit 2).

The scripts themselves run under a real Slurm in tests/integration (``sbatch --test-only`` for every
variant written here, ``sbatch --wait`` on one and two nodes); PBS and LSF are not packaged, so their
scripts are run here with the variables and host files those schedulers document.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.launch.scripts import JobScript, parse_walltime, render

REPORT_ENV = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "report_env.py"


def _script(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["script", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def _launch(lines: list[str]) -> list[str]:
    """The launch command of a script, joined over backslash continuations and split like bash."""
    text = "\n".join(lines).replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if " -m ringtrain run " in line]
    return shlex.split(line)


def _directives(lines: list[str], prefix: str) -> list[str]:
    return [line for line in lines if line.startswith(prefix)]


MASTER_FLAGS = ["--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT"]


def test_slurm_script(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "--nodes", "2", "--procs-per-node", "4", "--time", "01:30:00",
                    "--partition", "gpu", "--job-name", "mnist", "--account", "proj7", "--python",
                    "/opt/py/bin/python", "--cpus-per-proc", "1", "--", "python", "train.py", "--epochs", "5",
                    "--name", "a b")
    assert lines[0] == "#!/bin/bash"
    assert _directives(lines, "#SBATCH") == [
        "#SBATCH --job-name=mnist", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=4", "#SBATCH --time=01:30:00", "#SBATCH --partition=gpu",
        "#SBATCH --account=proj7", "#SBATCH --output=ringtrain-%j.out"]
    assert "set -eo pipefail" in lines
    assert "set -u" in lines
    # srun is given the task's CPUs itself: Slurm 22.05+ does not pass --cpus-per-task on to srun.
    assert _launch(lines) == ["srun", "--ntasks-per-node=1", "--cpus-per-task=$SLURM_CPUS_PER_TASK",
                              "--kill-on-bad-exit=1", "/opt/py/bin/python", "-m", "ringtrain", "run",
                              "--nproc-per-node", "4", *MASTER_FLAGS, "python", "train.py", "--epochs", "5",
                              "--name", "a b"]


def test_slurm_head_node_and_port_come_from_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "2", "--nproc-per-node", "1", "--", "python3", "x.py")
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)' in lines
    # picked free on node 0 when the job starts, not derived from the job number (which can collide)
    port = [line for line in lines if line.startswith("MASTER_PORT=")]
    assert port == ["MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); "
                    "print(s.getsockname()[1])')"]
    assert "export MASTER_PORT" in lines


def test_slurm_gpus_cpus_and_setup_lines(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "1", "--procs-per-node", "2", "--gpus-per-node", "2",
                    "--cpus-per-proc", "3", "--setup", "module load cuda", "--venv", "/opt/my env/",
                    "--", "python", "x.py")
    assert "#SBATCH --gpus-per-node=2" in lines
    assert "#SBATCH --cpus-per-task=6" in lines
    assert "export OMP_NUM_THREADS=3  # --cpus-per-proc cores for each rank" in lines
    setup = lines.index("set -eo pipefail")
    assert lines[setup + 1:setup + 4] == [". '/opt/my env'/bin/activate", "module load cuda", "set -u"]
    launch = _launch(lines)
    assert "--gpu-bind=none" in launch  # the node's one task keeps all its GPUs
    assert launch[launch.index("-m") - 1] == "python3"  # the venv's interpreter, found on its PATH


def test_slurm_time_qos_and_mail(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "1", "--nproc-per-node", "1", "-t", "50:00:00", "-q", "long",
                    "--mail-user", "me@example.org", "--mail-type", "begin,fail", "--", "x")
    directives = _directives(lines, "#SBATCH")
    assert "#SBATCH --time=2-02:00:00" in directives
    assert "#SBATCH --qos=long" in directives
    assert "#SBATCH --mail-user=me@example.org" in directives
    assert "#SBATCH --mail-type=BEGIN,FAIL" in directives


def test_default_interpreter_is_python3_of_the_job_never_this_machines_path(
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "1", "--procs-per-node", "1", "--", "python", "x.py")
    launch = _launch(lines)
    assert launch[launch.index("-m") - 1] == "python3"
    assert sys.executable not in "\n".join(lines)
    assert "if ! python3 -c 'import ringtrain' 2>/dev/null; then" in lines


def test_pbs_script(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "pbs", "--nodes", "3", "--procs-per-node", "2", "--time", "02:00:00",
                    "-q", "workq", "--account", "proj7", "--gpus-per-node", "2", "--python", "python3",
                    "--mail-user", "me@example.org", "--cpus-per-proc", "1", "--", "python", "train.py")
    assert _directives(lines, "#PBS") == [
        "#PBS -N ringtrain", "#PBS -l select=3:ncpus=2:mpiprocs=2:ngpus=2", "#PBS -l place=scatter",
        "#PBS -l walltime=02:00:00", "#PBS -q workq", "#PBS -A proj7", "#PBS -M me@example.org", "#PBS -m ea",
        "#PBS -j oe"]
    assert 'cd "$PBS_O_WORKDIR"' in lines
    assert 'MASTER_ADDR=$(sed -n 1p "$PBS_NODEFILE")' in lines
    # each host's `ringtrain run`, started by pbsdsh with its node rank and the number of hosts
    assert _launch(lines) == ["exec", "python3", "-m", "ringtrain", "run", "--nproc-per-node", "2",
                              "--nnodes", "$2", "--node-rank", "$1", *MASTER_FLAGS, "python", "train.py"]


def test_pbs_torque_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "pbs", "-N", "2", "--procs-per-node", "8", "--pbs-resources", "nodes",
                    "--cpus-per-proc", "2", "--", "python", "t.py")
    assert "#PBS -l nodes=2:ppn=16" in lines
    assert "#PBS -l place=scatter" not in lines  # Torque has no place=


def test_lsf_script(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "lsf", "-N", "2", "--nproc-per-node", "4", "--cpus-per-proc", "2", "-t",
                    "01:00:30", "-q", "normal", "-P", "proj7", "--gpus-per-node", "4", "--mail-type", "all",
                    "--", "python3", "t.py")
    assert _directives(lines, "#BSUB") == [
        "#BSUB -J ringtrain", "#BSUB -n 16", '#BSUB -R "span[ptile=8]"', '#BSUB -gpu "num=4"',
        "#BSUB -W 01:01", "#BSUB -q normal", "#BSUB -P proj7", "#BSUB -B", "#BSUB -N",
        "#BSUB -o ringtrain-%J.out"]
    assert 'MASTER_ADDR=$(sed -n 1p "$LSB_DJOB_HOSTFILE")' in lines


@pytest.mark.parametrize(("text", "seconds"), [("01:30:00", 5400), ("0:00:01", 1), ("48:00:00", 172800),
                                               ("100:59:59", 363599)])
def test_walltime_is_hh_mm_ss(text: str, seconds: int) -> None:
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "lsf"])
def test_scripts_are_valid_bash(scheduler: str) -> None:
    text = render(JobScript(scheduler=scheduler, nodes=2, procs_per_node=2, command=("python", "it's.py"),
                            setup=("module load x",), time="01:00:00", gpus_per_node=1, cpus_per_proc=2))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


#: pbsdsh as PBS documents it: ``-n INDEX -- PROGRAM ARGS`` runs PROGRAM once on the host of line INDEX of
#: ``$PBS_NODEFILE`` (here: this host), as a task of the job (``PBS_TASKNUM`` > 1, ``PBS_VNODENUM`` =
#: INDEX), in the home folder and with the job's environment, never the calling script's exports.
FAKE_PBSDSH = """#!/bin/bash
[ "$1" = -n ] || { echo "fake pbsdsh: only -n INDEX -- PROGRAM" >&2; exit 64; }
index=$2; shift 2; [ "$1" = -- ] && shift
echo "$index" >> "$PBSDSH_LOG"
cd "$HOME"
exec env -u MASTER_ADDR -u MASTER_PORT -u RINGTRAIN_JOB_SECRET -u OMP_NUM_THREADS \\
    PBS_TASKNUM=$((index + 2)) PBS_VNODENUM="$index" "$@"
"""


def _run_script(text: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.sh"
    script.write_text(text)
    bin_dir = Path(sys.executable).parent
    fake_bin = tmp_path / "pbs-bin"
    fake_bin.mkdir(exist_ok=True)
    (fake_bin / "pbsdsh").write_text(FAKE_PBSDSH)
    (fake_bin / "pbsdsh").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{fake_bin}{os.pathsep}{os.environ['PATH']}"
    full = {**os.environ, **env, "PATH": path, "OMP_NUM_THREADS": "1",
            "PBSDSH_LOG": str(tmp_path / "pbsdsh.log")}
    full.pop("RINGTRAIN_JOB_SECRET", None)
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["pbs", "lsf"])
def test_pbs_and_lsf_scripts_run_inside_their_documented_environment(scheduler: str, tmp_path: Path) -> None:
    """No PBS or LSF here: the script runs as the scheduler would run it on the first host of a one-node
    job (its job id, host file and working folder set as documented; PBS's pbsdsh as documented), and
    starts its ranks."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost\n" * 4)  # the job holds 4 slots of one host; the script runs 2 ranks
    out = tmp_path / "out"
    out.mkdir()
    env = ({"PBS_JOBID": "8812.pbs01", "PBS_NODEFILE": str(hostfile), "PBS_O_WORKDIR": str(tmp_path)}
           if scheduler == "pbs" else {"LSB_JOBID": "4711", "LSB_DJOB_HOSTFILE": str(hostfile)})
    text = render(JobScript(scheduler=scheduler, nodes=1, procs_per_node=2,
                            command=("python3", str(REPORT_ENV), str(out))))
    # Another job on this node holds the port that 15000 + the job number would give: the script's port
    # is picked free when the job starts, so this job starts all the same.
    derived = 15000 + (8812 if scheduler == "pbs" else 4711)
    with socket.socket() as other_job:
        other_job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other_job.bind(("", derived))
        other_job.listen()
        result = _run_script(text, tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = {int(p.stem): json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(ranks) == [0, 1]
    assert '--master-port "$MASTER_PORT"' in text
    # node 0 is the host file's first host; the ranks reach the job store on the script's port
    assert {env["MASTER_ADDR"] for env in ranks.values()} == {"localhost"}
    assert len({env["MASTER_PORT"] for env in ranks.values()}) == 1
    (store,) = {env["RINGTRAIN_JOB_STORE"] for env in ranks.values()}
    assert store.startswith("localhost:")
    assert int(store.rpartition(":")[2]) != derived
    # one secret for the job, the same on every rank; threads as the script exported them
    assert len({env["RINGTRAIN_JOB_SECRET"] for env in ranks.values()}) == 1
    share = max(1, len(os.sched_getaffinity(0)) // 2)  # this node's cores (nproc) over its 2 ranks
    assert {env["OMP_NUM_THREADS"] for env in ranks.values()} == {str(share)}
    if scheduler == "pbs":  # one pbsdsh task, on the host file's first line; its node script is gone
        assert (tmp_path / "pbsdsh.log").read_text() == "0\n"
        assert not list(tmp_path.glob(".ringtrain-node-*"))


def test_a_script_whose_python_lacks_ringtrain_says_so(tmp_path: Path) -> None:
    text = render(JobScript(scheduler="pbs", nodes=1, procs_per_node=1, command=("x",), python="/bin/false"))
    result = _run_script(text, tmp_path, {"PBS_JOBID": "1", "PBS_NODEFILE": "/dev/null",
                                          "PBS_O_WORKDIR": str(tmp_path)})
    assert result.returncode == 2
    assert "job: /bin/false (/bin/false) cannot import ringtrain" in result.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["slurm", "--nodes", "0", "--procs-per-node", "2", "--", "x"], "--nodes 0 must be at least 1"),
    (["slurm", "--nodes", "1", "--procs-per-node", "0", "--", "x"], "--procs-per-node 0 must be at least 1"),
    (["pbs", "--nodes", "1", "--procs-per-node", "1"], "no command to run"),
    (["pbs", "--nodes", "1", "--procs-per-node", "1", "--"], "no command to run"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--time", "90 minutes", "--", "x"], "'90 minutes'"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--time", "1:99", "--", "x"],
     "--time '1:99' is not a wall time in HH:MM:SS"),
    (["pbs", "-N", "1", "--procs-per-node", "1", "--time", "90", "--", "x"],
     "--time '90' is not a wall time"),
    (["lsf", "-N", "1", "--procs-per-node", "1", "--time", "00:00:00", "--", "x"], "more than zero"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--job-name", "a b", "--", "x"], "--job-name 'a b'"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--gpus-per-node", "-1", "--", "x"], "--gpus-per-node -1"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--setup", "a\nb", "--", "x"], "spans several lines"),
    (["slurm", "-N", "1", "--nproc-per-node", "1", "--queue", "gpu", "--", "x"],
     "--queue 'gpu': Slurm calls its queues partitions. HINT: use --partition gpu"),
    (["pbs", "-N", "1", "--nproc-per-node", "1", "--partition", "gpu", "--", "x"],
     "--partition 'gpu': PBS has queues, not partitions. HINT: use --queue gpu"),
    (["pbs", "-N", "1", "--nproc-per-node", "1", "--qos", "high", "--", "x"], "PBS has no QOS"),
    (["lsf", "-N", "1", "--nproc-per-node", "1", "-p", "gpu", "--", "x"], "LSF has queues, not partitions"),
    (["slurm", "-N", "1", "--nproc-per-node", "1", "-P", "proj", "--", "x"], "HINT: use --account proj"),
    (["slurm", "-N", "1", "--nproc-per-node", "1", "--mail-type", "sometimes", "--", "x"],
     "'sometimes' is not one of begin, end, fail, all"),
    (["slurm", "-N", "1", "--nproc-per-node", "1", "--partition", "gpu;rm -rf", "--", "x"],
     "--partition 'gpu;rm -rf' holds characters"),
    (["slurm", "-N", "1", "--nproc-per-node", "1", "--requeue", "--", "ringtrain", "train", "mnist"],
     "--requeue: the command `ringtrain train` writes no snapshot"),
    (["lsf", "-N", "1", "--nproc-per-node", "1", "--requeue", "--signal-before", "0", "--", "x"],
     "--signal-before 0 must be at least 1"),
    (["pbs", "-N", "1", "--nproc-per-node", "1", "--requeue", "--signal-before", "60", "--", "x"],
     "--signal-before '60': PBS sends no warning ahead of the walltime"),
])
def test_bad_input_exits_2_with_a_hint(argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["script", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ringtrain script: error: ")
    assert message in captured.err
    assert "HINT:" in captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["slurm", "-N", "1", "--procs-per-node", "1", "--bogus", "3", "--", "x"],
     "unrecognized arguments: --bogus"),
    (["pbs", "-N", "1", "--procs-per-node", "1", "--pbs-resources", "torque", "--", "x"], "invalid choice"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--pbs-resources", "nodes", "--", "x"], "unrecognized"),
    (["slurm", "--procs-per-node", "1", "--", "x"], "required: --nodes"),
    (["slurm", "--nodes", "two", "--procs-per-node", "1", "--", "x"], "invalid int value: 'two'"),
])
def test_unknown_options_exit_2_with_a_hint(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["script", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"ringtrain script {argv[0]}: error: " in err
    assert message in err
    assert "HINT: " in err
    assert f"`ringtrain script {argv[0]} --help` lists the options." in err


@pytest.mark.parametrize(("argv", "example"), [
    (["slurm", "--", "x"], "HINT: add e.g. `--nodes 2 --nproc-per-node 2`."),
    (["pbs", "--nodes", "2", "--", "x"], "HINT: add e.g. `--nproc-per-node 2`."),
    (["kubernetes", "--nodes", "2", "--", "x"],
     "HINT: add e.g. `--kind trainjob --nproc-per-node 2 --image IMAGE`."),
])
def test_a_missing_required_option_is_shown_with_an_example(argv: list[str], example: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["script", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert example in err


@pytest.mark.parametrize("argv", [["sge", "--nodes", "1", "--procs-per-node", "1", "--", "x"], []])
def test_parser_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["script", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    # one line: the error, the schedulers to choose from, and where the usage is (printed on --help only)
    assert err.startswith("ringtrain script: error: ")
    assert [name for name in ("slurm", "pbs", "lsf") if name not in err] == []
    assert "`ringtrain script --help` lists the commands." in err
    assert "usage:" not in err


def test_requeue_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "2", "--nproc-per-node", "1", "--requeue", "--signal-before",
                    "300", "--", "python3", "-m", "ringtrain", "train", "mnist", "--snapshot-dir", "snaps")
    assert "#SBATCH --signal=B:USR1@300" in lines
    assert '    if ! scontrol requeue "$SLURM_JOB_ID"; then' in lines
    # the launch: in the background, and srun waits for every node (no --kill-on-bad-exit)
    assert _launch(lines)[:3] == ["srun", "--ntasks-per-node=1", "--cpus-per-task=$SLURM_CPUS_ON_NODE"]
    assert _launch(lines)[-1] == "&"
    lines = _script(capsys, "pbs", "-N", "1", "--nproc-per-node", "1", "--requeue", "--", "python3", "t.py")
    assert "#PBS -r y" in lines
    assert '    if ! qrerun "$PBS_JOBID"; then' in lines
