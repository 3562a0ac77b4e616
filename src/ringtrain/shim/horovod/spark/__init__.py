"""``horovod.spark``: Horovod's Spark runner, forwarded to :mod:`ringtrain.spark` (docs/spark.md).

Importing it without PySpark installed raises ringtrain's ImportError, which names ``pip install
'ringtrain[spark]'``.
"""

from __future__ import annotations

from ringtrain.spark import run, run_elastic

__all__ = ["run", "run_elastic"]
