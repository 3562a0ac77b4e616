"""Without PySpark or Java, ``import ringtrain.spark`` (and the shim's ``horovod.spark``) fails in one line
that names the fix; with them, ``horovod.spark`` is ringtrain's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ringtrain.shim import SHIM_DIR

pytestmark = pytest.mark.slow  # each test starts a Python of its own

_NO_PYSPARK = "import sys; sys.modules['pyspark'] = None; "
_EXTRA = "the spark extra is not installed (pip install -e '.[test,ray,spark]')"


def _last_error_line(code: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode != 0, result.stdout
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("module", ["ringtrain.spark", "horovod.spark"])
def test_import_without_pyspark_names_the_extra(module: str) -> None:
    last = _last_error_line(_NO_PYSPARK + f"sys.path.insert(0, {str(SHIM_DIR)!r}); import {module}")
    assert last.startswith("ImportError: ringtrain.spark needs PySpark")
    assert "pip install 'ringtrain[spark]'" in last


def test_import_without_java_names_the_package() -> None:
    pytest.importorskip("pyspark", reason=_EXTRA)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)  # the venv's bin: python, no java
    last = _last_error_line("import ringtrain.spark", env)
    assert last.startswith("ImportError: ringtrain.spark needs a Java runtime")
    assert "apt-get install default-jre-headless" in last


def test_ringtrain_imports_without_pyspark() -> None:
    code = _NO_PYSPARK + "import ringtrain, ringtrain.launch.api; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr


def test_the_shims_horovod_spark_is_ringtrains() -> None:
    pytest.importorskip("pyspark", reason=_EXTRA)
    code = (f"import sys; sys.path.insert(0, {str(SHIM_DIR)!r}); import horovod.spark, ringtrain.spark; "
            "print(horovod.spark.run is ringtrain.spark.run, "
            "horovod.spark.run_elastic is ringtrain.spark.run_elastic)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["True", "True"], result.stderr
