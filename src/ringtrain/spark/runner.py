"""``ringtrain.spark.run``: Horovod's ``horovod.spark.run`` on ringtrain's engine and job store.

What ``run()`` does, in order: find the active SparkContext; wait (up to ``start_timeout``) until the
cluster has ``num_proc`` task slots, since a barrier stage runs all its tasks at once or not at all;
on a master of this machine (``local``, ``local-cluster``) where nobody chose the executors' Python,
give ringtrain's tasks the driver's; check with one small task that the executors' Python imports
ringtrain; host the job store here in the driver under a fresh secret; run one barrier stage of
``num_proc`` tasks (:class:`~ringtrain.spark.task.RankTask`, with the secret inside the pickled task,
never in a command line or the Spark UI), and watch it from this thread while another one waits for
Spark.

A rank that fails ends the whole run at once: Spark would otherwise retry the barrier stage, all
ranks again. The error names the root cause: an executor that was lost (by its host) before a rank
that merely lost its connection to it, and the first failed rank's own traceback otherwise.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import cloudpickle

from ringtrain.engine import auth
from ringtrain.spark.task import RankTask

if TYPE_CHECKING:  # imported where used: job_store imports torch, and an executor's Python worker
    # imports this package (to unpickle a RankTask) and needs no torch; only the rank's process does
    from ringtrain.engine import job_store

#: Seconds between looks at the running stage.
_POLL_S = 0.5
#: Seconds the driver waits, once a rank failed, for Spark to report an executor lost: a rank whose
#: peer's executor died fails on its broken connection first, and the lost executor is the root cause.
_ROOT_CAUSE_WAIT_S = 15.0
#: Horovod's default start timeout, and the variable that overrides it.
_DEFAULT_START_TIMEOUT_S = 600.0
_START_TIMEOUT_VARIABLE = "HOROVOD_SPARK_START_TIMEOUT"


class ExecutorLostError(RuntimeError):
    """A Spark executor that ran ranks of the job went away (its process or its host died)."""


class RankFailedError(RuntimeError):
    """A rank's function raised, or the rank's process ended without a result."""


class ExecutorPythonError(RuntimeError):
    """The executors' Python cannot import ringtrain, so no rank could start there."""


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        num_proc: int | None = None, start_timeout: float | None = None, env: Mapping[str, str] | None = None,
        stdout: IO[str] | None = None, stderr: IO[str] | None = None, verbose: int = 1) -> list[Any]:
    """``fn(*args, **kwargs)`` in ``num_proc`` Spark tasks as one Horovod job; the results in rank order.

    ``num_proc``: the number of ranks (default: the context's ``defaultParallelism``); ranks are grouped
    by executor host. ``start_timeout``: seconds to wait for that many task slots and for the tasks to
    start (default ``HOROVOD_SPARK_START_TIMEOUT``, else 600); it is also the ranks' ``hvd.init()``
    timeout. ``env``: variables set in every rank over the executor's own environment (ringtrain's
    rank variables win over them). ``stdout`` / ``stderr``: where each rank's output is written, line
    by line with a ``[rank]`` prefix, once the ranks finish (default: this process's); the executors'
    logs have it as it happens. ``verbose``: 0 silent, 1 one line per run, 2 where every rank ran.
    """
    settings = _checked(fn, args, kwargs, num_proc, start_timeout, env, verbose)
    from pyspark import SparkContext  # the spark extra; ringtrain.spark checked that it imports

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("ringtrain.spark.run found no active SparkContext. HINT: create one first, e.g. "
                           "spark = SparkSession.builder.master('spark://HOST:7077').getOrCreate().")
    size = settings["num_proc"] or int(sc.defaultParallelism)
    timeout_s = settings["start_timeout"]
    out, err = stdout or sys.stdout, stderr or sys.stderr
    _wait_for_slots(sc, size, timeout_s)
    python = local_executor_python(str(sc.master), os.environ, sc.getConf().get("spark.pyspark.python"),
                                   getattr(sc, "pythonExec", None))
    # The context is the caller's and its conf is fixed, but the Python a job's tasks start with is read
    # from sc.pythonExec as each job is submitted: set for ringtrain's own jobs only, then put back.
    chosen_before = getattr(sc, "pythonExec", None)
    if python is not None:
        sc.pythonExec = python
    try:
        check_executor_python(sc)
        secret = auth.new_secret()
        server = _store_server(sc, secret)
        job = f"ringtrain-spark-{uuid.uuid4().hex[:12]}"
        task = RankTask(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))), secret, server.address,
                        job, timeout_s, env, _horovod_dir())
        watch = _Watch(sc, job, size, server, timeout_s)
        if verbose >= 1:
            which = f", tasks on this driver's Python {python} (PYSPARK_PYTHON unset)" if python else ""
            print(f"ringtrain.spark: {size} rank(s) in one barrier stage (Spark job group {job}), job store "
                  f"at {server.address}{which}", file=err, flush=True)
        try:
            records = watch.run(task)
        finally:
            server.close()
    finally:
        if python is not None:  # put back what the context had (pyspark's own always has one)
            if chosen_before is None:
                del sc.pythonExec
            else:
                sc.pythonExec = chosen_before
    results: list[Any] = [None] * size
    for rank, host, value, rank_out, rank_err in sorted(records, key=lambda r: r[0]):
        results[rank] = value
        _write_prefixed(out, rank, rank_out)
        _write_prefixed(err, rank, rank_err)
        if verbose >= 2:
            print(f"ringtrain.spark: rank {rank} ran on {host}", file=err, flush=True)
    return results


def _checked(fn: Any, args: Any, kwargs: Any, num_proc: Any, start_timeout: Any, env: Any,
             verbose: Any) -> dict[str, Any]:
    if not callable(fn):
        raise TypeError(f"fn={fn!r} is not callable. HINT: ringtrain.spark.run(train_fn, num_proc=2).")
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise TypeError(f"args={args!r} must be a tuple or list of positional arguments, e.g. args=(lr,).")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs={kwargs!r} must be a dict of keyword arguments, e.g. kwargs={{'lr': 0.1}}.")
    if num_proc is not None and (isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1):
        raise ValueError(f"num_proc={num_proc!r} must be a whole number of at least 1 (one Spark task "
                         "per rank). HINT: num_proc=2, or leave it out for defaultParallelism.")
    if start_timeout is None:
        text = os.environ.get(_START_TIMEOUT_VARIABLE, "").strip()
        try:
            start_timeout = float(text) if text else _DEFAULT_START_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{_START_TIMEOUT_VARIABLE}={text!r} is not a number of seconds. HINT: "
                             f"export {_START_TIMEOUT_VARIABLE}=600, or pass start_timeout=.") from None
    if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float) \
            or not start_timeout > 0 or start_timeout == float("inf"):
        raise ValueError(f"start_timeout={start_timeout!r} must be a positive number of seconds. "
                         "HINT: start_timeout=600.")
    if env is not None and (not isinstance(env, Mapping)
                            or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise TypeError(f"env must map variable names to strings (got {type(env).__name__}). "
                        "HINT: env={'NCCL_DEBUG': 'INFO'}.")
    if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
        raise ValueError(f"verbose={verbose!r} must be 0, 1 or 2.")
    return {"num_proc": num_proc, "start_timeout": float(start_timeout)}


#: PySpark's own choice of the executors' Python when PYSPARK_PYTHON is unset: whatever python3 the
#: executor's PATH finds, in a virtualenv driver not the driver's interpreter.
PYSPARK_DEFAULT_PYTHON = "python3"


def local_executor_python(master: str, environ: Mapping[str, str], conf_python: str | None,
                          python_exec: str | None) -> str | None:
    """The interpreter ringtrain's tasks should start with instead of PySpark's default, or None to keep
    the context's.

    Only on masters whose executors run on this machine (``local``, ``local[N]``, ``local-cluster[...]``),
    where the driver's ``sys.executable`` exists for them too, and only where nobody chose: neither
    ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` is set and the context kept PySpark's default. On a
    cluster the driver's path may not exist on the executors' hosts; there the pre-flight check tells.
    """
    local = master == "local" or master.startswith(("local[", "local-cluster["))
    if not local or environ.get("PYSPARK_PYTHON") or conf_python:
        return None
    if python_exec not in (None, PYSPARK_DEFAULT_PYTHON):
        return None  # set on the context by its owner
    return sys.executable or None


def _import_probe() -> Callable[[Any], tuple[str, str]]:
    """A task that reports its interpreter and whether it imports ringtrain.

    Made in a function so that cloudpickle sends it by value: a task that named this module would fail
    to unpickle on exactly the executors this is meant to diagnose.
    """
    def probe(_: Any) -> tuple[str, str]:
        import sys as executor_sys

        try:
            import ringtrain  # noqa: F401
        except Exception as exc:  # whatever stops the import is the answer
            return executor_sys.executable, f"{type(exc).__name__}: {exc}"
        return executor_sys.executable, ""

    return probe


def check_executor_python(sc: Any) -> None:
    """Before the barrier stage: one small task checks that the executors' Python imports ringtrain.

    Without it, an executor started with another interpreter than the driver's (PySpark's default is
    ``python3`` from PATH when ``PYSPARK_PYTHON`` is unset, not the driver's virtualenv) fails every rank
    on unpickling, inside dozens of lines of Java stack trace.
    """
    executable, problem = "", ""
    try:
        executable, problem = sc.parallelize([0], 1).map(_import_probe()).collect()[0]
    except Exception as exc:  # Spark wraps a worker that cannot start in a Java error
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        cause = next((line for line in lines if "Error" in line and not line.startswith("at ")), lines[0]
                     if lines else type(exc).__name__)
        problem = cause[:300]
    if not problem:
        return
    started = getattr(sc, "pythonExec", None) or "python3"  # what the SparkContext starts tasks with
    chosen = os.environ.get("PYSPARK_PYTHON")
    source = f"PYSPARK_PYTHON={chosen}" if chosen else "PYSPARK_PYTHON is unset"
    raise ExecutorPythonError(
        f"the Spark executors' Python ({executable or started}) cannot import ringtrain ({problem}); the "
        f"SparkContext starts tasks with `{started}` ({source}). HINT: set PYSPARK_PYTHON={sys.executable} "
        "(this driver's Python) before creating the SparkSession, or pip install ringtrain (and torch) "
        "into the executors' Python.")


def task_slots(sc: Any) -> int | None:
    """How many tasks the cluster runs at once now (None: this Spark does not say)."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # a private Spark API: absent or changed in other versions
        return None


def _wait_for_slots(sc: Any, size: int, timeout_s: float) -> None:
    """Until the cluster has ``size`` slots: executors of a cluster just started register over seconds,
    and Spark would refuse a barrier stage larger than the cluster (or retry it for minutes)."""
    deadline = time.monotonic() + timeout_s
    slots = task_slots(sc)
    while slots is not None and slots < size:
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"num_proc={size} needs {size} Spark task slots at once (a barrier stage), but the cluster "
                f"has {slots} (after waiting start_timeout={timeout_s:g} s). HINT: lower num_proc to "
                f"{max(slots, 1)}, or add executors or cores (spark.executor.cores, spark.task.cpus).")
        time.sleep(_POLL_S)
        slots = task_slots(sc)


def _store_server(sc: Any, secret: str) -> job_store.JobStoreServer:
    """The job store, on the address executors already use to reach this driver (``spark.driver.host``)."""
    from ringtrain.engine import job_store

    host_name = sc.getConf().get("spark.driver.host") or socket.gethostname()
    try:
        host = socket.gethostbyname(host_name)
    except OSError:
        host = host_name
    try:
        return job_store.JobStoreServer(secret, host=host, port=0)
    except OSError:
        # behind NAT or in a pod the advertised address is not one of ours: listen everywhere instead
        server = job_store.JobStoreServer(secret, host="0.0.0.0", port=0)
        server.host = host
        return server


class _Watch:
    """One barrier stage, submitted in a thread of its own and watched from the caller's."""

    def __init__(self, sc: Any, job: str, size: int, server: job_store.JobStoreServer,
                 timeout_s: float) -> None:
        self.sc, self.job, self.size, self.timeout_s = sc, job, size, timeout_s
        self._server = server
        self.store: job_store.JobStore | None = None  # the driver's own connection, opened by run()
        self._records: list[Any] | None = None
        self._error: BaseException | None = None

    def run(self, task: RankTask) -> list[Any]:
        from ringtrain.engine import job_store

        self.store = job_store.JobStore(self._server.address, task.secret, timeout=30.0)
        executors = _executors(self.sc)
        thread = threading.Thread(target=self._collect, args=(task,), name="ringtrain-spark-collect",
                                  daemon=True)
        thread.start()
        deadline = time.monotonic() + self.timeout_s
        started = False
        try:
            while thread.is_alive():
                thread.join(_POLL_S)
                if not thread.is_alive():
                    break
                progress = self._progress()
                if not started:
                    started = progress["running"] + progress["done"] >= self.size
                    if not started and time.monotonic() >= deadline:
                        self._cancel()
                        raise TimeoutError(
                            f"only {progress['running'] + progress['done']} of num_proc={self.size} Spark "
                            f"tasks started within start_timeout={self.timeout_s:g} s (the cluster has "
                            f"{task_slots(self.sc)} task slots; other jobs may hold them). HINT: free the "
                            "slots, lower num_proc, or raise start_timeout.")
                if progress["failed"] or self._error_count():
                    self._fail(executors, thread)
                # every executor seen alive while the run was healthy: one that dies later is a suspect
                executors.update({i: e for i, e in _executors(self.sc).items() if e.active})
            if self._error is not None:
                self._fail(executors, thread)
        finally:
            self.store.close()
        return list(self._records or [])

    def _collect(self, task: RankTask) -> None:
        try:
            self.sc.setJobGroup(self.job, f"ringtrain.spark.run: {self.size} ranks", interruptOnCancel=True)
            rdd = self.sc.parallelize(range(self.size), self.size)
            self._records = rdd.barrier().mapPartitions(task).collect()
        except BaseException as exc:  # handed to the watching thread
            self._error = exc

    def _progress(self) -> dict[str, int]:
        """Tasks running, done and failed in the job group's stages (all attempts of the stage)."""
        tracker = self.sc.statusTracker()
        totals = {"running": 0, "done": 0, "failed": 0}
        for job_id in tracker.getJobIdsForGroup(self.job):
            info = tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info is not None else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is None:
                    continue
                totals["running"] += stage.numActiveTasks
                totals["done"] += stage.numCompletedTasks
                totals["failed"] += stage.numFailedTasks + (1 if stage.currentAttemptId > 0 else 0)
        return totals

    def _error_count(self) -> int:
        assert self.store is not None
        return int(self.store.add(f"{self.job}/errors", 0))

    def _fail(self, executors: Mapping[str, _Executor], thread: threading.Thread) -> None:
        """Raise for the root cause: a lost executor first, else the rank that reported an error first, else
        what Spark raised (a task that failed before its rank started, say)."""
        deadline = time.monotonic() + _ROOT_CAUSE_WAIT_S
        lost = _lost(executors, _executors(self.sc))
        while not lost and time.monotonic() < deadline and self._error_count() < self.size:
            time.sleep(_POLL_S)
            lost = _lost(executors, _executors(self.sc))
        errors = self._rank_errors()
        self._cancel()
        thread.join(timeout=30.0)
        if lost:
            raise ExecutorLostError(self._lost_text(lost, errors)) from None
        if errors:
            rank = min(errors, key=lambda r: errors[r][0])
            others = sorted(r for r in errors if r != rank)
            also = f" (rank(s) {', '.join(map(str, others))} failed too)" if others else ""
            raise RankFailedError(f"rank {rank}{self._where(rank)} failed{also}; the other ranks were "
                                  f"stopped. Its error:\n{errors[rank][1]}") from None
        if self._error is not None:
            raise self._error
        raise RankFailedError(f"a task of the barrier stage failed (Spark job group {self.job}) without a "
                              "rank reporting why; the run was stopped. HINT: the executors' logs (Spark UI, "
                              "Executors tab) hold its output.")

    def _rank_errors(self) -> dict[int, tuple[int, str]]:
        """Each failed rank's (order of its report, error text)."""
        assert self.store is not None
        errors = {}
        for rank in range(self.size):
            key = f"{self.job}/error/{rank}"
            if self.store.check([key]):
                order, _, text = self.store.get(key).decode(errors="replace").partition("\n")
                errors[rank] = (int(order) if order.isdigit() else self.size + 1, text)
        return errors

    def _where(self, rank: int) -> str:
        assert self.store is not None
        key = f"{self.job}/host/{rank}"
        return f" on host {self.store.get(key).decode()}" if self.store.check([key]) else ""

    def _lost_text(self, lost: list[_Executor], errors: Mapping[int, Any] | None = None) -> str:
        hosts = ", ".join(sorted({e.host for e in lost}))
        why = "; ".join(f"executor {e.id}: {e.reason}" for e in lost if e.reason)
        hosts += f" ({why})" if why else ""
        ranks = ""
        if errors is not None:
            failed = sorted(errors)
            ranks = f" (rank(s) {', '.join(map(str, failed))} then failed on their broken links)" \
                if failed else ""
        return (f"the Spark executor on host {hosts} was lost while it ran ranks of this job{ranks}; the "
                f"run was stopped (Spark job group {self.job}). HINT: look for that executor's failure (out "
                "of memory, host lost, killed) in the Spark UI or the worker's logs, then run again.")

    def _cancel(self) -> None:
        try:
            self.sc.cancelJobGroup(self.job)
        except Exception:  # the context may be stopping; nothing is left to cancel then
            pass


@dataclass(frozen=True)
class _Executor:
    """One executor as Spark's status store (the UI's Executors tab) lists it."""

    id: str
    host: str
    active: bool
    reason: str


def _executors(sc: Any) -> dict[str, _Executor]:
    """Every executor Spark knows of, removed ones included, by id (the driver left out)."""
    found: dict[str, _Executor] = {}
    try:
        listed = sc._jsc.sc().statusStore().executorList(False)
        for i in range(listed.size()):
            summary = listed.apply(i)
            if summary.id() == "driver":
                continue
            reason = summary.removeReason()
            text = str(reason.get()) if reason.isDefined() else ""
            host = str(summary.hostPort()).rsplit(":", 1)[0]
            found[str(summary.id())] = _Executor(str(summary.id()), host, bool(summary.isActive()), text)
    except Exception:  # a private Spark API, or a stopped context: nothing to compare then
        return {}
    return found


def _lost(before: Mapping[str, _Executor], now: Mapping[str, _Executor]) -> list[_Executor]:
    """The executors active in ``before`` that ``now`` lists as removed."""
    return [now[i] for i in sorted(before) if before[i].active and i in now and not now[i].active]


def _write_prefixed(stream: IO[str], rank: int, text: str) -> None:
    if not text:
        return
    lines = text.splitlines()
    stream.write("".join(f"[{rank}] {line}\n" for line in lines))
    stream.flush()


def _horovod_dir() -> str | None:
    """Where this process imported ``horovod`` from: ``"shim"`` for ringtrain's own shim (each executor
    finds it in its own ringtrain), a folder for another one, None when not imported here."""
    module = sys.modules.get("horovod")
    origin = getattr(module, "__file__", None)
    if not origin:
        return None
    folder = Path(origin).resolve().parent.parent
    if folder.name == "shim" and folder.parent.name == "ringtrain":
        return "shim"
    return str(folder)
