"""One rank of ``ringtrain train``: ``python -m ringtrain.train.worker --job JOB.json [--error-dir DIR]``.

Started by ``ringtrain run`` (or any launcher: torchrun, srun, mpirun) on every rank.
Bad input exits 2 with the message on stderr (and in ``DIR/rank-N.txt``); a graceful stop on a handled
signal exits 75 (rank 0 leaves ``DIR/preempted.txt``: ``preempted at step S, snapshot P``); anything
else is a crash whose traceback reaches the launcher's root-cause report.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing.errors import record

from ringtrain.train.job import TrainJob, input_errors, run_job, write_error
from ringtrain.train.preemption import NOTE_NAME, PREEMPTED_EXIT, Preempted


@record
def main(argv: Sequence[str] | None = None) -> int:
    """Run one rank of the job described by ``--job``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.train.worker")
    parser.add_argument("--job", required=True, help="JSON file written by ringtrain train")
    parser.add_argument("--error-dir", help="folder for rank-N.txt files holding input errors")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
    try:
        with open(args.job, encoding="utf-8") as fp:
            job = TrainJob.from_json(fp.read())
        run_job(job)
    except input_errors() as exc:
        message = str(exc)
        if args.error_dir:
            write_error(args.error_dir, rank, message)
        print(f"ringtrain train: error (rank {rank}): {message}", file=sys.stderr, flush=True)
        # The Trainer has left the group; the interpreter's own exit took another 3.5 s per rank.
        sys.stdout.flush()
        os._exit(2)
    except Preempted as stop:
        # every rank stopped after the same step and the snapshot is on disk; rank 0 tells the launcher
        if rank == 0 and args.error_dir:
            write_error(args.error_dir, rank, str(stop), name=NOTE_NAME)
        print(f"ringtrain train: rank {rank} {stop}", file=sys.stderr, flush=True)
        # The snapshot is fsynced and the group left: end now. The interpreter's own exit (its threads
        # and destructors) took 3.5 s of the scheduler's grace.
        sys.stdout.flush()
        os._exit(PREEMPTED_EXIT)
    except KeyboardInterrupt:
        # Stopped (Ctrl-C reaches every rank): end now. A normal exit would run the destructors of the
        # process group and the DDP wrapper, which wait for peers that have stopped too.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signal.SIGINT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
