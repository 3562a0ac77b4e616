"""A launcher that ends preempted requeues its batch job (launch/requeue.py), and when a node counts as
preempted (launch/report.py's ``preempted``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.launch.report import RankFailure, preempted
from ringtrain.launch.requeue import requeue_command, requeue_job


@pytest.mark.parametrize(("environ", "command"), [
    ({"SLURM_JOB_ID": "4242"}, ["scontrol", "requeue", "4242"]),
    ({"PBS_JOBID": "77.pbs01"}, ["qrerun", "77.pbs01"]),
    ({"LSB_JOBID": "9"}, ["brequeue", "9"]),
    ({"SLURM_JOB_ID": " "}, None),
    ({}, None),
])
def test_each_scheduler_requeues_its_own_job(environ: dict[str, str], command: list[str] | None) -> None:
    assert requeue_command(environ) == command


def test_a_requeued_job_ends_0_and_a_refused_or_impossible_requeue_stays_preempted(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []

    def taken(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    assert requeue_job({"SLURM_JOB_ID": "4242"}, taken) == 0
    assert calls == [["scontrol", "requeue", "4242"]]
    err = capsys.readouterr().err
    assert "requeued the job (`scontrol requeue 4242`); it resumes from the snapshot" in err

    def refused(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 1, "", "qrerun: Unauthorized Request  77.pbs01\n")

    assert requeue_job({"PBS_JOBID": "77.pbs01"}, refused) == 75
    err = capsys.readouterr().err
    assert "`qrerun 77.pbs01` failed: qrerun: Unauthorized Request  77.pbs01. HINT: submit the job" in err

    def missing(argv: list[str]) -> subprocess.CompletedProcess[str]:
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    assert requeue_job({"LSB_JOBID": "9"}, missing) == 75
    assert "`brequeue 9` failed: FileNotFoundError" in capsys.readouterr().err
    assert requeue_job({}, taken) == 75
    assert "no Slurm, PBS or LSF batch job" in capsys.readouterr().err


def _failure(code: int) -> RankFailure:
    return RankFailure(host="h", rank=0, local_rank=0, exitcode=code, pid=1, time=1.0)


@pytest.mark.parametrize(("codes", "expected"), [
    ([75], True),
    ([75, 75], True),
    ([75, -signal.SIGTERM], True),  # the agent stopped the other rank as it was ending too
    ([-signal.SIGTERM, 75, 128 + signal.SIGTERM], True),
    ([75, 1], False),  # a rank that failed: a failure to report, not a preemption
    ([-signal.SIGTERM], False),
    ([75, -signal.SIGKILL], False),
    ([], False),
])
def test_a_node_is_preempted_when_a_rank_ended_75_and_the_others_too_or_were_stopped(
        codes: list[int], expected: bool) -> None:
    assert preempted([_failure(code) for code in codes]) is expected


@pytest.mark.slow
def test_ringtrain_run_requeue_requeues_the_job_when_its_ranks_end_preempted(tmp_path: Path) -> None:
    fake = tmp_path / "qrerun"
    fake.write_text(f'#!/bin/sh\necho "qrerun $*" >> {tmp_path}/calls\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "PBS_JOBID": "77.pbs01"}
    argv = [sys.executable, "-m", "ringtrain", "run", "--requeue", "-np", "1", sys.executable, "-c",
            "raise SystemExit(75)"]
    ended = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert ended.returncode == 0, ended.stderr
    assert (tmp_path / "calls").read_text() == "qrerun 77.pbs01\n"
