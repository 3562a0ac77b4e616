"""When the allocation ends: the scheduler's end time of this job, for a stop before the walltime.

* **Slurm**: ``SLURM_JOB_END_TIME`` (set in the job's environment by recent Slurm, seconds since the
  epoch), else ``squeue -h -j $SLURM_JOB_ID -o %e`` (the end time as the site's local
  ``YYYY-MM-DDTHH:MM:SS``).
* **PBS** (PBS Pro / OpenPBS, Torque): ``qstat -f $PBS_JOBID``. Torque's ``Walltime.Remaining`` (seconds
  left) when it is there, else the job's start (``stime`` in PBS Pro, ``start_time`` in Torque, both in
  ``ctime`` form, ``Thu Feb 22 14:27:48 2018``) plus ``Resource_List.walltime`` (``[[HH:]MM:]SS``).
* **LSF**: ``bjobs -noheader -o time_left $LSB_JOBID``: ``hours:minutes L`` where a run limit exists
  (``bsub -W``). Only the ``L`` status counts: ``E`` is an estimate (``bsub -We``), which LSF does not
  enforce. Minutes only: the end is known to within a minute, which the Trainer's margin (120 s) covers.

None where no end time is known (no scheduler, an unlimited job, the command missing or silent).
The PBS and LSF readings follow the schedulers' documented output; this machine has neither, so they
are tested against recorded output, not a live scheduler.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time
from collections.abc import Callable, Mapping

Runner = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def _ask(run: Runner, argv: list[str]) -> str | None:
    try:
        return run(argv)
    except (OSError, subprocess.SubprocessError):
        return None


def allocation_end(environ: Mapping[str, str], run: Runner = _run,
                   now: Callable[[], float] = time.time) -> float | None:
    """Seconds since the epoch at which the scheduler ends this job, or None when that is not known."""
    if environ.get("SLURM_JOB_END_TIME", "").strip() or environ.get("SLURM_JOB_ID", "").strip():
        return slurm_end(environ, run)
    if environ.get("PBS_JOBID", "").strip():
        return pbs_end(environ["PBS_JOBID"].strip(), run, now)
    if environ.get("LSB_JOBID", "").strip():
        return lsf_end(environ["LSB_JOBID"].strip(), run, now)
    return None


def slurm_end(environ: Mapping[str, str], run: Runner = _run) -> float | None:
    value = environ.get("SLURM_JOB_END_TIME", "").strip()
    if value.isdigit() and int(value) > 0:
        return float(value)
    job = environ.get("SLURM_JOB_ID", "").strip()
    text = _ask(run, ["squeue", "-h", "-j", job, "-o", "%e"]) if job else None
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.strip().splitlines()[0].strip()).timestamp()
    except (ValueError, IndexError):  # "N/A", "Unknown", nothing: no end time
        return None


def _seconds(hms: str) -> int | None:
    """``[[HH:]MM:]SS`` (hours may exceed 24) -> seconds; None when it is not that."""
    parts = hms.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total


def _attributes(text: str) -> dict[str, str]:
    """``qstat -f``'s ``name = value`` lines (a long value continues on tab-indented lines)."""
    found: dict[str, str] = {}
    last = None
    for line in text.splitlines():
        if line.startswith("\t") and last is not None:
            found[last] += line.strip()
            continue
        name, sep, value = line.strip().partition(" = ")
        if sep:
            found[name.strip()] = value.strip()
            last = name.strip()
    return found


def pbs_end(job: str, run: Runner = _run, now: Callable[[], float] = time.time) -> float | None:
    text = _ask(run, ["qstat", "-f", job])
    if not text:
        return None
    attrs = _attributes(text)
    remaining = attrs.get("Walltime.Remaining", "")
    if remaining.isdigit():  # Torque: seconds left, counted by the server
        return now() + int(remaining)
    limit = _seconds(attrs.get("Resource_List.walltime", ""))
    started = attrs.get("stime") or attrs.get("start_time")
    if limit is None or not started:
        return None
    try:
        start = time.mktime(time.strptime(started.strip(), "%a %b %d %H:%M:%S %Y"))
    except ValueError:
        return None
    return start + limit


_LSF_LEFT = re.compile(r"^(\d+):(\d{1,2})(?::(\d{1,2}))?\s+L\b")


def lsf_end(job: str, run: Runner = _run, now: Callable[[], float] = time.time) -> float | None:
    text = _ask(run, ["bjobs", "-noheader", "-o", "time_left", job])
    match = _LSF_LEFT.match(text.strip()) if text else None
    if match is None:  # "-" (no limit), "E" or "X" (an estimate), an error: no end time
        return None
    hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return now() + hours * 3600 + minutes * 60 + seconds


__all__ = ["allocation_end", "lsf_end", "pbs_end", "slurm_end"]
