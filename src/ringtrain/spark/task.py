"""The barrier task: what runs in a Spark executor's Python worker for one rank.

It reads its place from ``BarrierTaskContext`` (:mod:`ringtrain.spark.places`), then runs the user's
function in a child process of its own (:mod:`ringtrain.spark.rank_process`) with the rank's
variables and the job's secret in that child's environment only. A child, not the worker itself,
because PySpark reuses its Python workers from task to task: a rank's ``hvd.init()``, its threads and
its variables must not outlive the rank. The child dies with the worker (``PR_SET_PDEATHSIG``), so a
task that Spark kills, or an executor that dies, leaves no rank behind.

The child's output is copied line by line to this worker's own stdout/stderr (the executor's logs)
and kept, its last :data:`KEPT_BYTES` per stream, for the driver.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import cloudpickle

from ringtrain.engine import auth
from ringtrain.spark.places import assign_places, rank_environ

#: How much of each of a rank's streams goes back to the driver (the executor's log has it all).
KEPT_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


class RankTask:
    """The function of ``rdd.barrier().mapPartitions``: one rank per partition, one record back.

    Pickled into the stage's task binary (never into a command line or the Spark UI), which is how
    the job's secret reaches the executors. ``horovod_dir``: where the driver imported ``horovod``
    from, or ``"shim"`` for ringtrain's own shim (found again in this executor's ringtrain), or None.
    """

    def __init__(self, payload: bytes, secret: str, store_address: str, job: str, gloo_timeout_s: float,
                 env: Mapping[str, str] | None, horovod_dir: str | None) -> None:
        self.payload = payload
        self.secret = secret
        self.store_address = store_address
        self.job = job
        self.gloo_timeout_s = gloo_timeout_s
        self.env = dict(env or {})
        self.horovod_dir = horovod_dir

    def __call__(self, partition: Iterable[Any]) -> Iterator[tuple[int, str, Any, str, str]]:
        from pyspark import BarrierTaskContext  # the spark extra, present in an executor

        context = BarrierTaskContext.get()
        addresses = [info.address for info in context.getTaskInfos()]
        place = assign_places(addresses)[context.partitionId()]
        # The stage's attempt, the same in every task: a retried stage gets new task ids, so it never
        # reads the job store keys of the attempt before it. (allGather is also the tasks' start barrier.)
        attempt = min(int(i) for i in context.allGather(str(context.taskAttemptId())))
        environ = dict(os.environ)
        environ.update(rank_environ(place, self.store_address, self.gloo_timeout_s, attempt, self.env))
        environ[auth.ENV_SECRET] = self.secret
        environ["RINGTRAIN_SPARK_JOB"] = self.job
        pythonpath = _horovod_path(self.horovod_dir)
        if pythonpath:
            environ["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, environ.get("PYTHONPATH")) if p)
        outcome, out, err = _run_rank(self.payload, environ)
        if outcome[0] != "ok":
            # Spark records this in the stage's failure; the driver has the full text from the job store
            raise RuntimeError(f"ringtrain.spark: rank {place.rank} on {place.host} failed: {outcome[1]}\n"
                               f"{outcome[2]}")
        yield place.rank, place.host, outcome[1], out, err


def _run_rank(payload: bytes, environ: dict[str, str]) -> tuple[tuple[Any, ...], str, str]:
    """Run the rank's child process; (its outcome, its stdout, its stderr)."""
    fd, result_path = tempfile.mkstemp(prefix="ringtrain-spark-", suffix=".result")
    os.close(fd)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ringtrain.spark.rank_process", result_path],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=environ, preexec_fn=_die_with_parent)
        kept = {"out": bytearray(), "err": bytearray()}
        copiers = [threading.Thread(target=_copy, args=(proc.stdout, sys.stdout, kept["out"]), daemon=True),
                   threading.Thread(target=_copy, args=(proc.stderr, sys.stderr, kept["err"]), daemon=True)]
        for copier in copiers:
            copier.start()
        assert proc.stdin is not None
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; its exit code and stderr say why
        code = proc.wait()
        for copier in copiers:
            copier.join(timeout=10.0)
        out, err = (bytes(kept[k]).decode(errors="replace") for k in ("out", "err"))
        data = Path(result_path).read_bytes()
        if not data:
            name = f"exit code {code}"
            if code < 0:
                try:
                    name = signal.Signals(-code).name
                except ValueError:
                    name = f"signal {-code}"
            return ("error", f"the rank's process ended ({name}) before it reported a result",
                    err[-4000:]), out, err
        return cloudpickle.loads(data), out, err
    finally:
        Path(result_path).unlink(missing_ok=True)


def _copy(source: IO[bytes] | None, target: IO[str], kept: bytearray) -> None:
    """Copy a child's stream line by line to ``target`` and keep its tail in ``kept``."""
    if source is None:
        return
    for line in iter(source.readline, b""):
        try:
            target.write(line.decode(errors="replace"))
            target.flush()
        except (OSError, ValueError):
            pass  # the worker's own stream is gone; the driver still gets the kept copy
        kept.extend(line)
        if len(kept) > KEPT_BYTES:
            del kept[:len(kept) - KEPT_BYTES]


def _horovod_path(horovod_dir: str | None) -> str | None:
    """The folder to put on the rank's PYTHONPATH so that ``import horovod`` works as on the driver."""
    if horovod_dir is None or importlib.util.find_spec("horovod") is not None:
        return None
    if horovod_dir == "shim":
        import ringtrain

        return str(Path(ringtrain.__file__).resolve().parent / "shim")
    return horovod_dir


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
