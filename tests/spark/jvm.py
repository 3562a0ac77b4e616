"""JVM options for the tests' Spark JVMs (drivers, executors, the standalone master and workers).

Each test's JVMs live for seconds to a minute, most of it loading and first running Spark's classes, so
the JIT's optimizing tier (C2) and a parallel collector cost CPU that never pays back: C1 alone
(``TieredStopAtLevel=1``) compiles enough for those short lives, the serial collector uses no GC
threads, and no perf-data file is kept. Nothing the tests assert depends on them. (Users' clusters keep
Spark's own defaults: this module serves the tests only.)
"""

from __future__ import annotations

#: For ``SPARK_DAEMON_JAVA_OPTS``, ``spark.driver.extraJavaOptions`` and ``spark.executor.extraJavaOptions``.
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
