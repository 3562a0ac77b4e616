"""One rank of a ``ringtrain.spark.run`` job: ``python -m ringtrain.spark.rank_process RESULT_FILE``.

Started by :mod:`ringtrain.spark.task` with the rank's variables and the job's secret in its
environment, and the cloudpickled ``(fn, args, kwargs)`` on stdin. It says where it runs in the job
store (``<job>/host/<rank>``), runs ``fn``, and writes ``("ok", result)`` or ``("error", summary,
traceback)`` to RESULT_FILE. A failure also goes to the job store (``<job>/error/<rank>``, numbered by
the count ``<job>/errors``) at once, so that the driver learns of it while the other ranks still wait
in their collectives, and names it as the root cause.
"""

from __future__ import annotations

import os
import socket
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import cloudpickle

if TYPE_CHECKING:  # the annotation only: torch stays out of Spark's worker
    from ringtrain.engine.job_store import JobStore


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m ringtrain.spark.rank_process RESULT_FILE (started by ringtrain.spark.run)",
              file=sys.stderr)
        return 2
    result = Path(argv[0])
    job, rank = os.environ.get("RINGTRAIN_SPARK_JOB", "job"), os.environ.get("RANK", "?")
    store = None
    try:
        fn, args, kwargs = cloudpickle.loads(sys.stdin.buffer.read())
        store = _job_store()
        store.set(f"{job}/host/{rank}", socket.gethostname())
        value = fn(*args, **kwargs)
        data = cloudpickle.dumps(("ok", value))
    except BaseException as exc:  # every failure of the rank goes back to the driver
        summary, text = f"{type(exc).__name__}: {exc}", traceback.format_exc()
        if store is not None:
            try:
                # the count orders the reports: the first rank to fail is the root cause, the others
                # mostly fail because it left
                order = store.add(f"{job}/errors", 1)
                store.set(f"{job}/error/{rank}", f"{order}\n{summary}\n{text}")
            except Exception:  # the driver is gone too; the task's own error remains
                pass
        result.write_bytes(cloudpickle.dumps(("error", summary, text)))
        sys.stderr.write(text)
        return 1
    result.write_bytes(data)
    return 0


def _job_store() -> JobStore:  # torch is imported here, in the rank, never in Spark's worker
    from ringtrain.engine import job_store
    from ringtrain.engine.settings import read_knob

    address = job_store.address_from_environ(os.environ)
    if address is None:
        raise RuntimeError(f"{job_store.ENV_ADDRESS} is not set: this module runs only under "
                           "ringtrain.spark.run")
    timeout = float(read_knob("gloo_timeout_s"))  # the driver sets it (spark/places.py's rank_environ)
    return job_store.JobStore(address, job_store.secret_from_environ(os.environ), timeout=timeout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
