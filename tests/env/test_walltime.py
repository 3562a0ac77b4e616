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


#: ``qstat -f`` of a running PBS Pro job (the attributes read here, among others).
PBS_PRO = """Job Id: 1234.server
    Job_Name = train
    job_state = R
    Resource_List.ncpus = 8
    Resource_List.walltime = 02:00:00
    stime = Fri Nov 27 10:00:00 2026
    Variable_List = PBS_O_HOME=/home/u,PBS_O_LANG=C,
\tPBS_O_PATH=/usr/bin
"""

#: ``qstat -f`` of a running Torque job: it counts the seconds left itself.
TORQUE = """Job Id: 548.moab
    Resource_List.walltime = 01:00:00
    start_time = Fri Nov 27 10:00:00 2026
    Walltime.Remaining = 3593
"""


def test_pbs_end_is_the_start_plus_the_walltime_read_from_qstat():
    asked = []

    def qstat(argv):
        asked.append(argv)
        return PBS_PRO

    end = allocation_end({"PBS_JOBID": "1234.server"}, run=qstat)
    assert asked == [["qstat", "-f", "1234.server"]]
    assert end == datetime.datetime(2026, 11, 27, 12, 0).timestamp()


def test_torques_seconds_remaining_win_over_the_start_time():
    assert allocation_end({"PBS_JOBID": "548.moab"}, run=lambda argv: TORQUE, now=lambda: 1000.0) == 4593.0


def test_pbs_without_a_walltime_or_a_start_gives_none():
    assert allocation_end({"PBS_JOBID": "1"}, run=lambda argv: "Job Id: 1\n    job_state = R\n") is None
    no_start = "Job Id: 1\n    Resource_List.walltime = 01:00:00\n"
    assert allocation_end({"PBS_JOBID": "1"}, run=lambda argv: no_start) is None

    def missing(argv):
        raise FileNotFoundError("qstat")

    assert allocation_end({"PBS_JOBID": "1"}, run=missing) is None


def test_lsf_end_is_now_plus_the_time_left_to_the_run_limit():
    asked = []

    def bjobs(argv):
        asked.append(argv)
        return "1:30 L\n"

    assert allocation_end({"LSB_JOBID": "77"}, run=bjobs, now=lambda: 1000.0) == 1000.0 + 90 * 60
    assert asked == [["bjobs", "-noheader", "-o", "time_left", "77"]]
    # LSB_HMS_TIME_FORMAT=Y shows seconds too
    assert allocation_end({"LSB_JOBID": "77"}, run=lambda argv: "00:02:05 L", now=lambda: 0.0) == 125.0


def test_lsf_without_a_run_limit_or_with_an_estimate_only_gives_none():
    for shown in ("-\n", "1:30 E\n", "0:00 X\n", ""):
        assert allocation_end({"LSB_JOBID": "77"}, run=lambda argv, shown=shown: shown) is None, shown

    def fails(argv):
        raise subprocess.CalledProcessError(255, argv)

    assert allocation_end({"LSB_JOBID": "77"}, run=fails) is None
