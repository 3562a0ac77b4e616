"""Without Ray, ``import ringtrain.ray`` (and the shim's ``horovod.ray``) fails with one clear hint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ringtrain.shim import SHIM_DIR

# sys.modules["ray"] = None makes `import ray` fail as if Ray were not installed
_NO_RAY = "import sys; sys.modules['ray'] = None; "


@pytest.mark.parametrize("module", ["ringtrain.ray", "horovod.ray"])
def test_import_without_ray_names_the_extra(module: str) -> None:
    code = _NO_RAY + f"sys.path.insert(0, {str(SHIM_DIR)!r}); import {module}"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ringtrain.ray needs Ray")
    assert "pip install 'ringtrain[ray]'" in last


def test_ringtrain_imports_without_ray() -> None:
    code = _NO_RAY + "import ringtrain, ringtrain.launch.api; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr


def test_the_shims_horovod_ray_is_ringtrains() -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")
    code = (f"import sys; sys.path.insert(0, {str(SHIM_DIR)!r}); import horovod.ray, ringtrain.ray; "
            "print(horovod.ray.RayExecutor is ringtrain.ray.RayExecutor, "
            "horovod.ray.ElasticRayExecutor is ringtrain.ray.ElasticRayExecutor, "
            "horovod.ray.BaseHorovodWorker is ringtrain.ray.RayWorker, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # and without torch: every worker actor imports the package, only the ranks' functions need torch
    assert result.stdout.split() == ["True", "True", "True", "False"], result.stderr
