"""The allocation's end time from Slurm's environment or squeue."""

import datetime
import subprocess

from ringtrain.env.walltime import allocation_end


def test_slurms_end_time_variable_is_read_first():
    assert allocation_end({"SLURM_JOB_END_TIME": "1800000000", "SLURM_JOB_ID": "7"},
                          run=lambda argv: "unused") == 1800000000.0


def test_squeue_is_asked_for_the_job_and_its_local_time_read():
    asked = []

    def squeue(argv):
        asked.append(argv)
        return "2026-11-27T12:30:00\n"

    end = allocation_end({"SLURM_JOB_ID": "42"}, run=squeue)
    assert asked == [["squeue", "-h", "-j", "42", "-o", "%e"]]
    assert end == datetime.datetime(2026, 11, 27, 12, 30).timestamp()


def test_no_scheduler_an_unlimited_job_or_a_failing_squeue_give_none():
    assert allocation_end({}) is None
    assert allocation_end({"SLURM_JOB_ID": "42"}, run=lambda argv: "N/A\n") is None
    assert allocation_end({"SLURM_JOB_ID": "42"}, run=lambda argv: "") is None

    def missing(argv):
        raise FileNotFoundError("squeue")

    def fails(argv):
        raise subprocess.CalledProcessError(1, argv)

    assert allocation_end({"SLURM_JOB_ID": "42"}, run=missing) is None
    assert allocation_end({"SLURM_JOB_ID": "42"}, run=fails) is None
