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

import os as _os
import shutil as _shutil
from typing import Any

# Spark's driver is a JVM that pyspark starts: without Java, SparkSession.builder fails later with a
# page of "Java gateway process exited"; say it here in one line instead.
_java_home = _os.environ.get("JAVA_HOME", "").strip()
if not (_java_home and _os.access(_os.path.join(_java_home, "bin", "java"), _os.X_OK)) \
        and _shutil.which("java") is None:
    raise ImportError("ringtrain.spark needs a Java runtime for Spark, and none was found (no java on PATH, "
                      f"JAVA_HOME={_java_home or 'unset'}). HINT: apt-get install default-jre-headless "
                      "(Java 17+), or set JAVA_HOME to a JDK/JRE folder.")

from ringtrain.spark.runner import (  # noqa: E402
    ExecutorLostError,
    ExecutorPythonError,
    RankFailedError,
    run,
    task_slots,
)


def run_elastic(*args: Any, **kwargs: Any) -> Any:
    """Horovod's elastic Spark runner: not supported; refused with the way to run an elastic job."""
    raise NotImplementedError(
        "ringtrain.spark.run_elastic (horovod.spark.run_elastic) is not supported: a Spark barrier stage "
        "has a fixed number of tasks. HINT: use ringtrain.spark.run(fn, num_proc=N) for a fixed-size job, "
        "or `ringtrain run --min-np N --max-np M` on a host list for an elastic one (docs/elastic.md).")


__all__ = ["ExecutorLostError", "ExecutorPythonError", "RankFailedError", "run", "run_elastic", "task_slots"]
