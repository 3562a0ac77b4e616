"""When the allocation ends: the scheduler's end time of this job, for a stop before the walltime.

Slurm: ``SLURM_JOB_END_TIME`` (set in the job's environment by recent Slurm, seconds since the epoch),
else ``squeue -h -j $SLURM_JOB_ID -o %e`` (the end time as the site's local ``YYYY-MM-DDTHH:MM:SS``).
None where no end time is known (no scheduler, an unlimited job, squeue missing or silent). PBS
walltime and LSF run limits are not read yet.
"""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Callable, Mapping

Runner = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def allocation_end(environ: Mapping[str, str], run: Runner = _run) -> float | None:
    """Seconds since the epoch at which the scheduler ends this job, or None when that is not known."""
    value = environ.get("SLURM_JOB_END_TIME", "").strip()
    if value.isdigit() and int(value) > 0:
        return float(value)
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    try:
        text = run(["squeue", "-h", "-j", job, "-o", "%e"]).strip()
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return datetime.datetime.fromisoformat(text.splitlines()[0].strip()).timestamp()
    except (ValueError, IndexError):  # "N/A", "Unknown", nothing: no end time
        return None


__all__ = ["allocation_end"]
