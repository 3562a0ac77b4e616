"""``ringtrain.spark.run`` on Spark's ``local[2]`` master: one driver JVM with two task slots, shared by
the module (starting it costs seconds). The two-host standalone cluster is in
tests/integration/test_spark_two_hosts.py.

The functions given to ``run`` are defined inside the tests, so cloudpickle sends them by value and the
ranks need not import this module.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[test,ray,spark]')")

import ringtrain.spark
from ringtrain.spark import RankFailedError
from tests.spark.jvm import QUICK_JVM_OPTIONS


def test_bad_arguments_are_refused_before_spark_is_asked() -> None:
    with pytest.raises(TypeError, match="fn=3 is not callable"):
        ringtrain.spark.run(3)
    with pytest.raises(ValueError, match="num_proc=0 must be a whole number"):
        ringtrain.spark.run(print, num_proc=0)
    with pytest.raises(ValueError, match="start_timeout=-1 must be a positive"):
        ringtrain.spark.run(print, start_timeout=-1)
    with pytest.raises(TypeError, match="args='ab' must be a tuple"):
        ringtrain.spark.run(print, args="ab")
    with pytest.raises(TypeError, match="env must map variable names to strings"):
        ringtrain.spark.run(print, env={"A": 1})
    with pytest.raises(NotImplementedError, match="run_elastic .* is not supported"):
        ringtrain.spark.run_elastic(print, num_proc=2)


def test_a_bad_start_timeout_variable_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_SPARK_START_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HOROVOD_SPARK_START_TIMEOUT='soon' is not a number"):
        ringtrain.spark.run(print)


def test_without_a_spark_context_the_error_says_how_to_make_one() -> None:
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        pytest.skip("a SparkContext of another test is active")
    with pytest.raises(RuntimeError, match="no active SparkContext. HINT: create one first"):
        ringtrain.spark.run(print, num_proc=1)


def test_only_executors_seen_alive_and_now_removed_count_as_lost() -> None:
    from ringtrain.spark.runner import _Executor, _lost

    before = {"0": _Executor("0", "hostA", True, ""), "1": _Executor("1", "hostB", True, ""),
              "2": _Executor("2", "hostB", False, "an earlier run")}
    now = {"0": _Executor("0", "hostA", True, ""), "1": _Executor("1", "hostB", False, "code 137"),
           "2": _Executor("2", "hostB", False, "an earlier run"), "3": _Executor("3", "hostB", True, "")}
    assert _lost(before, now) == [now["1"]]
    assert _lost(before, before) == []


@pytest.mark.parametrize(("master", "environ", "conf", "exec_", "chosen"), [
    ("local[2]", {}, None, "python3", sys.executable),  # nobody chose: the driver's Python
    ("local", {}, None, None, sys.executable),
    ("local-cluster[2,1,1024]", {}, None, "python3", sys.executable),
    ("local[2]", {"PYSPARK_PYTHON": "/opt/py/bin/python"}, None, "/opt/py/bin/python", None),
    ("local[2]", {}, "/opt/py/bin/python", "python3", None),  # spark.pyspark.python
    ("local[2]", {}, None, "/opt/py/bin/python", None),  # set on the context by its owner
    ("spark://head:7077", {}, None, "python3", None),  # the executors' hosts may not have this path
    ("yarn", {}, None, "python3", None),
])
def test_the_driver_python_is_given_only_to_local_tasks_nobody_chose_for(
        master: str, environ: dict[str, str], conf: str | None, exec_: str | None,
        chosen: str | None) -> None:
    from ringtrain.spark.runner import local_executor_python

    assert local_executor_python(master, environ, conf, exec_) == chosen


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # the Python of the tasks: a driver started as plain python reads only this variable
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("ringtrain-spark-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", QUICK_JVM_OPTIONS)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        if before is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = before
        gateway = SparkContext._gateway
        if gateway is not None:  # the JVM exits once its stdin closes; the next module starts a fresh one
            gateway.shutdown()
            gateway.proc.stdin.close()
            gateway.proc.wait(timeout=60)
            SparkContext._gateway = None
            SparkContext._jvm = None


@pytest.mark.slow
@pytest.mark.integration
def test_a_horovod_function_returns_every_ranks_result_in_rank_order(spark: Any) -> None:
    def train(scale: float, offset: float = 0.0) -> tuple[int, int, int, float, str]:
        import torch

        import ringtrain as hvd

        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
        print(f"rank {hvd.rank()} says hello")
        import os

        return hvd.rank(), hvd.size(), hvd.local_size(), float(total) * scale + offset, os.environ["ENV_X"]

    out, err = io.StringIO(), io.StringIO()
    results = ringtrain.spark.run(train, args=(10.0,), kwargs={"offset": 1.0}, num_proc=2, start_timeout=120,
                                  env={"ENV_X": "x"}, stdout=out, stderr=err)
    assert results == [(0, 2, 2, 31.0, "x"), (1, 2, 2, 31.0, "x")]
    assert "[0] rank 0 says hello" in out.getvalue()
    assert "[1] rank 1 says hello" in out.getvalue()
    assert "ringtrain.spark: 2 rank(s) in one barrier stage" in err.getvalue()
    assert "RINGTRAIN_JOB_SECRET" not in out.getvalue() + err.getvalue()


@pytest.mark.slow
@pytest.mark.integration
def test_a_failing_rank_is_named_with_its_error_and_the_run_ends(spark: Any) -> None:
    def train() -> int:
        import ringtrain as hvd

        hvd.init()
        if hvd.rank() == 1:
            raise ValueError("rank one cannot go on")
        hvd.barrier()  # rank 0 waits here until rank 1's process is gone
        return hvd.rank()

    with pytest.raises(RankFailedError, match=r"rank 1 on host \S+ failed") as failure:
        ringtrain.spark.run(train, num_proc=2, start_timeout=120, stdout=io.StringIO(), stderr=io.StringIO())
    assert "ValueError: rank one cannot go on" in str(failure.value)


@pytest.mark.slow
@pytest.mark.integration
def test_more_ranks_than_task_slots_fail_after_the_start_timeout_naming_both(spark: Any) -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"num_proc=3 needs 3 Spark task slots .* the cluster has 2 "
                                           r"\(after waiting start_timeout=2 s\)"):
        ringtrain.spark.run(lambda: 0, num_proc=3, start_timeout=2, stderr=io.StringIO())
    assert time.monotonic() - started < 60  # the timeout, not Spark's ten minutes of barrier retries


def _python_without_ringtrain() -> str | None:
    """An interpreter of this machine that cannot import ringtrain (the system's python3), or None."""
    import shutil
    import subprocess

    for name in ("/usr/bin/python3", shutil.which("python3", path="/usr/bin:/bin")):
        if name and os.access(name, os.X_OK) and os.path.realpath(name) != os.path.realpath(sys.executable):
            probe = subprocess.run([name, "-c", "import ringtrain"], capture_output=True,
                                   env={"PATH": "/usr/bin:/bin"}, timeout=60)
            if probe.returncode != 0:
                return name
    return None


@pytest.mark.slow
@pytest.mark.integration
def test_executors_whose_python_lacks_ringtrain_are_named_in_one_line(spark: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from ringtrain.spark import ExecutorPythonError

    other = _python_without_ringtrain()
    if other is None:
        pytest.skip("no interpreter without ringtrain on this machine")
    sc = spark.sparkContext
    # as a driver whose PYSPARK_PYTHON names a Python without ringtrain gets (a context reads the variable
    # once, as it starts: its pythonExec is what the variable would have set)
    monkeypatch.setenv("PYSPARK_PYTHON", other)
    before, sc.pythonExec = sc.pythonExec, other
    try:
        def never_runs() -> int:
            raise AssertionError("no rank may start")

        with pytest.raises(ExecutorPythonError) as info:
            ringtrain.spark.run(never_runs, num_proc=2, start_timeout=60, verbose=0)
    finally:
        sc.pythonExec = before
    text = str(info.value)
    assert len(text.splitlines()) == 1, text
    assert f"the Spark executors' Python ({other}) cannot import ringtrain (ModuleNotFoundError" in text
    assert f"the SparkContext starts tasks with `{other}` (PYSPARK_PYTHON={other})" in text
    assert f"HINT: set PYSPARK_PYTHON={sys.executable}" in text
    assert "Py4J" not in text
    assert "at org.apache" not in text
    # the context still works with the right Python
    assert ringtrain.spark.run(lambda: 7, num_proc=1, verbose=0) == [7]


@pytest.mark.slow
@pytest.mark.integration
def test_local_tasks_get_the_driver_python_when_pyspark_python_is_unset(
        spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark's default (``python3`` from PATH) is another interpreter than a virtualenv driver's: on a
    local master ringtrain's tasks start with the driver's, for its own jobs only."""
    sc = spark.sparkContext
    monkeypatch.delenv("PYSPARK_PYTHON")
    before, sc.pythonExec = sc.pythonExec, "python3"  # what a context started without the variable has
    try:
        def executable() -> str:
            import sys

            return sys.executable

        err = io.StringIO()
        assert ringtrain.spark.run(executable, num_proc=1, stderr=err) == [sys.executable]
        assert sc.pythonExec == "python3"  # the caller's context as it was
    finally:
        sc.pythonExec = before
    assert f"tasks on this driver's Python {sys.executable} (PYSPARK_PYTHON unset)" in err.getvalue()
