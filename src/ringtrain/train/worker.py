"""One rank of ``ringtrain train``: ``python -m ringtrain.train.worker --job JOB.json [--error-dir DIR]``
(or ``--job-json TEXT``: the job itself, for ranks on other nodes, which cannot read the launcher's file).

Started by ``ringtrain run`` (or any launcher: torchrun, srun, mpirun) on every rank.
Bad input exits 2 with the message in ``DIR/rank-N.txt`` for ``ringtrain train``, and in the error file
of the elastic agent that started the rank (``TORCHELASTIC_ERROR_FILE``), whence the launcher's
root-cause report shows it once; started without such an agent, the rank prints it on stderr.
A graceful stop on a handled signal exits 75 (rank 0 leaves ``DIR/preempted.txt``: ``preempted at step
S, snapshot P``); anything else is a crash whose traceback reaches the launcher's root-cause report.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.errors import record

from ringtrain.train.job import TrainJob, input_errors, run_job, write_error
from ringtrain.train.preemption import NOTE_NAME, PREEMPTED_EXIT, Preempted


@record
def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank of the job described by ``--job``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.train.worker")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--job", help="JSON file written by ringtrain train")
    given.add_argument("--job-json", help="the job's JSON itself (ranks on other nodes than the launcher's)")
    parser.add_argument("--error-dir", help="folder for rank-N.txt files holding input errors (used where "
                                            "it exists: a rank on another node reports through its agent)")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
    if args.error_dir and not os.path.isdir(args.error_dir):
        args.error_dir = None  # the launcher's folder is not on this node (ringtrain train --ray)
    try:
        if args.job_json is not None:
            job = TrainJob.from_json(args.job_json)
        else:
            with open(args.job, encoding="utf-8") as fp:
                job = TrainJob.from_json(fp.read())
        run_job(job)
    except input_errors() as exc:
        message = str(exc)
        reported = report_to_agent(message, os.environ.get("TORCHELASTIC_ERROR_FILE"), _failed_at(exc))
        if args.error_dir:
            write_error(args.error_dir, rank, message, reported=reported)
        if not reported:
            print(f"ringtrain train: error (rank {rank}): {message}", file=sys.stderr, flush=True)
        return 2
    except Preempted as stop:
        # every rank stopped after the same step and the snapshot is on disk; rank 0 tells the launcher
        if rank == 0 and args.error_dir:
            write_error(args.error_dir, rank, str(stop), name=NOTE_NAME)
        print(f"ringtrain train: rank {rank} {stop}", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT
    except KeyboardInterrupt:
        # Stopped (Ctrl-C reaches every rank): end now. A normal exit would run the destructors of the
        # process group and the DDP wrapper, which wait for peers that have stopped too.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGINT)
    return 0


def _failed_at(exc: BaseException | None) -> float | None:
    """When this rank's own failure happened, as ``ringtrain.train.agreement`` noted it (on the exception
    or one it was raised from), or None."""
    for _ in range(8):
        if exc is None:
            return None
        if (when := getattr(exc, "failed_at", None)) is not None:
            return float(when)
        exc = exc.__cause__ or exc.__context__
    return None


def report_to_agent(message: str, path: str | None, when: float | None = None) -> bool:
    """Leave ``message`` in the agent's error file (torch's layout, without a traceback: bad input is no
    bug), where the root-cause report takes it from; returns whether it is there. ``when``: the time it
    failed (now by default; a rank that failed where all agree records it before the others heard of
    it, so that the report's root cause is that rank, not one that stopped because of it)."""
    if not path:
        return False
    when = time.time() if when is None else when
    body = {"message": {"message": message,
                        "extraInfo": {"py_callstack": "", "timestamp": str(int(when)), "time": repr(when)}}}
    temp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as fp:
            json.dump(body, fp)
        os.replace(temp, path)  # whole or not at all: the agent may read it as soon as this rank exits
    except OSError:
        try:
            os.remove(temp)
        except OSError:
            pass
        return False
    return True


def exit_now(code: int) -> NoReturn:
    """End the rank process with ``code`` without the interpreter's shutdown.

    On bad input and on a graceful stop the Trainer has already left the group (and fsynced its
    snapshot); the interpreter's own exit (its threads, the destructors of the process group and the
    DDP wrapper) took another 3.5 s per rank, out of the scheduler's grace. Only for the process's
    ``__main__``: called in-process, ``main`` returns its code.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    status = main()
    if status in (2, PREEMPTED_EXIT):
        exit_now(status)
    sys.exit(status)
