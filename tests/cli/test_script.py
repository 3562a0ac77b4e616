"""``ringtrain script slurm|pbs``: the job script's structure, options, and bad input (exit 2)."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from ringtrain.cli.main import main
from ringtrain.launch.scripts import JobScript, render


def _script(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(["script", *argv]) == 0
    return capsys.readouterr().out.splitlines()


def _launch(lines: list[str]) -> list[str]:
    """The launch command of a script, joined over backslash continuations and split like bash."""
    text = "\n".join(lines).replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if " -m ringtrain run " in line]
    return shlex.split(line)


def test_slurm_script(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "--nodes", "2", "--procs-per-node", "4", "--time", "01:30:00",
                    "--partition", "gpu", "--job-name", "mnist", "--account", "proj7", "--python",
                    "/opt/py/bin/python", "--", "python", "train.py", "--epochs", "5", "--name", "a b")
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --job-name=mnist", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --cpus-per-task=4", "#SBATCH --time=01:30:00", "#SBATCH --partition=gpu",
                          "#SBATCH --account=proj7", "#SBATCH --output=ringtrain-%j.out"]
    assert "set -euo pipefail" in lines
    assert _launch(lines) == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "/opt/py/bin/python",
                              "-m", "ringtrain", "run", "--nproc-per-node", "4", "python", "train.py",
                              "--epochs", "5", "--name", "a b"]


def test_slurm_gpus_cpus_and_setup_lines(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "1", "--procs-per-node", "2", "--gpus-per-node", "2",
                    "--cpus-per-proc", "3", "--setup", "module load cuda", "--venv", "/opt/my env/",
                    "--", "python", "x.py")
    assert "#SBATCH --gpus-per-node=2" in lines
    assert "#SBATCH --cpus-per-task=6" in lines
    setup = lines.index("set -euo pipefail")
    assert lines[setup + 1:setup + 3] == [". '/opt/my env'/bin/activate", "module load cuda"]
    assert _launch(lines)[3] == "python"  # the venv's interpreter


def test_default_interpreter_is_the_current_one(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "slurm", "-N", "1", "--procs-per-node", "1", "--", "python", "x.py")
    assert _launch(lines)[3] == sys.executable


def test_pbs_script(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "pbs", "--nodes", "3", "--procs-per-node", "2", "--time", "02:00:00",
                    "--queue", "workq", "--account", "proj7", "--gpus-per-node", "2", "--python", "python3",
                    "--", "python", "train.py")
    directives = [line for line in lines if line.startswith("#PBS")]
    assert directives == ["#PBS -N ringtrain", "#PBS -l select=3:ncpus=2:mpiprocs=2:ngpus=2",
                          "#PBS -l walltime=02:00:00", "#PBS -q workq", "#PBS -A proj7", "#PBS -j oe"]
    assert 'cd "$PBS_O_WORKDIR"' in lines
    assert _launch(lines) == ["python3", "-m", "ringtrain", "run", "-np", "6", "python", "train.py"]


def test_pbs_torque_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _script(capsys, "pbs", "-N", "2", "--procs-per-node", "8", "--pbs-resources", "nodes",
                    "--", "python", "t.py")
    assert "#PBS -l nodes=2:ppn=8" in lines


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_scripts_are_valid_bash(scheduler: str) -> None:
    text = render(JobScript(scheduler=scheduler, nodes=2, procs_per_node=2, command=("python", "it's.py"),
                            setup=("module load x",)))
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


@pytest.mark.parametrize(("argv", "message"), [
    (["slurm", "--nodes", "0", "--procs-per-node", "2", "--", "x"], "--nodes 0 must be at least 1"),
    (["slurm", "--nodes", "1", "--procs-per-node", "0", "--", "x"], "--procs-per-node 0 must be at least 1"),
    (["pbs", "--nodes", "1", "--procs-per-node", "1"], "no command to run"),
    (["pbs", "--nodes", "1", "--procs-per-node", "1", "--"], "no command to run"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--time", "90 minutes", "--", "x"], "'90 minutes'"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--job-name", "a b", "--", "x"], "--job-name 'a b'"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--gpus-per-node", "-1", "--", "x"], "--gpus-per-node -1"),
    (["slurm", "-N", "1", "--procs-per-node", "1", "--setup", "a\nb", "--", "x"], "spans several lines"),
])
def test_bad_input_exits_2_with_a_hint(argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["script", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ringtrain script: error: ")
    assert message in captured.err
    assert "HINT:" in captured.err


@pytest.mark.parametrize("argv", [
    ["lsf", "--nodes", "1", "--procs-per-node", "1", "--", "x"],
    ["slurm", "--procs-per-node", "1", "--", "x"],
    ["slurm", "--nodes", "two", "--procs-per-node", "1", "--", "x"],
    [],
])
def test_parser_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["script", *argv])
    assert info.value.code == 2
    assert "usage: ringtrain script" in capsys.readouterr().err
