"""Horovod's ``horovod.spark.run`` on ringtrain: a job's ranks as the tasks of a Spark barrier stage
(docs/spark.md)::

    from pyspark.sql import SparkSession
    import ringtrain.spark

    spark = SparkSession.builder.master("spark://head:7077").getOrCreate()
    results = ringtrain.spark.run(train_fn, args=(0.1,), num_proc=4)   # one result per rank, rank order

PySpark is an optional dependency (``pip install 'ringtrain[spark]'``, plus a Java runtime); importing
this package without it raises one ImportError that says so.
"""

from __future__ import annotations

try:
    import pyspark as _pyspark  # noqa: F401 - only to fail early with the install hint
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("ringtrain.spark needs PySpark, which is not installed. HINT: pip install "
                      f"'ringtrain[spark]' (pyspark 4.0) and a Java 17+ runtime ({exc}).") from None

from typing import Any

from ringtrain.spark.runner import ExecutorLostError, RankFailedError, run, task_slots


def run_elastic(*args: Any, **kwargs: Any) -> Any:
    """Horovod's elastic Spark runner: not supported; refused with the way to run an elastic job."""
    raise NotImplementedError(
        "ringtrain.spark.run_elastic (horovod.spark.run_elastic) is not supported: a Spark barrier stage "
        "has a fixed number of tasks. HINT: use ringtrain.spark.run(fn, num_proc=N) for a fixed-size job, "
        "or `ringtrain run --min-np N --max-np M` on a host list for an elastic one (docs/elastic.md).")


__all__ = ["ExecutorLostError", "RankFailedError", "run", "run_elastic", "task_slots"]
