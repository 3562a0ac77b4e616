"""The barrier task's side of ``ringtrain.spark.run``: what runs in a Spark executor's Python worker.

The task itself runs in tests/spark/test_runner.py (a local Spark) and on the two-host cluster.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[test,ray,spark]')")


@pytest.mark.slow  # a Python of its own, to see its imports
def test_the_executors_side_imports_no_torch() -> None:
    """An executor's Python worker unpickles the task (importing ringtrain.spark) and sets its rank's
    variables; torch is only the rank's process's to import: in the worker it would cost seconds per
    worker and its memory for the worker's life."""
    code = ("import sys, ringtrain.spark.task as task; "
            "place = task.assign_places(['hostA:1', 'hostB:2'])[1]; "
            "env = task.rank_environ(place, 'hostA:29400', 30.0); "
            "print(env['RANK'], env['MASTER_ADDR'], env['MASTER_PORT'], 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["1", "hostA", "29400", "False"], result.stderr
