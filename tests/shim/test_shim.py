"""The horovod shim: an unmodified ``import horovod.torch as hvd`` script on 2 ranks, the CLI that
prints the shim path, and the small helpers Horovod's own tests import."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.main import main
from ringtrain.shim import SHIM_DIR, real_horovod_importable, shim_pythonpath

SCRIPT = Path(__file__).resolve().parent / "hvd_script.py"
ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def _check_results(out_dir: Path) -> None:
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, result in enumerate(results):
        assert result["rank"] == rank
        assert result["size"] == 2
        assert result["total"] == 3.0
        assert result["horovod"].startswith(str(SHIM_DIR))
    assert results[0]["weight"] == results[1]["weight"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["python -m ringtrain.shim", "PYTHONPATH"])
def test_unmodified_script_on_two_ranks(tmp_path, how):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    if how == "PYTHONPATH":
        cmd, env = [*torchrun, str(SCRIPT), str(tmp_path)], _env(PYTHONPATH=str(SHIM_DIR))
    else:
        cmd, env = [*torchrun, "-m", "ringtrain.shim", str(SCRIPT), str(tmp_path)], _env()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_results(tmp_path)


def test_shim_main_without_arguments_and_missing_script(capsys, monkeypatch):
    from ringtrain.shim.__main__ import main as shim_main

    # main() enables the shim in this process (sys.path, PYTHONPATH) before it finds the script missing:
    # undo that after the test, or later tests of this worker see a shim already on PYTHONPATH
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))

    assert shim_main([]) == 2
    assert shim_main(["/no/such/script.py"]) == 2
    assert "does not exist. HINT:" in capsys.readouterr().err


def test_shim_path_command(capsys):
    assert main(["shim-path"]) == 0
    printed = capsys.readouterr().out.strip()
    assert Path(printed) == SHIM_DIR
    assert (Path(printed) / "horovod" / "torch" / "__init__.py").is_file()


def test_in_thread_and_util_helpers():
    sys.path.insert(0, str(SHIM_DIR))
    try:
        from horovod.common.util import env, split_list
        from horovod.runner.util.threads import in_thread
    finally:
        sys.path.remove(str(SHIM_DIR))
        for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
            del sys.modules[name]  # other tests look for a real horovod
    box = []
    thread = in_thread(lambda a, b: box.append(a + b), args=(2, 3))
    thread.join(5)
    assert box == [5]
    assert thread.daemon
    quiet = in_thread(lambda: 1 / 0, silent=True)
    quiet.join(5)
    assert not quiet.is_alive()
    with env(RINGTRAIN_SHIM_TEST="1"):
        assert os.environ["RINGTRAIN_SHIM_TEST"] == "1"
    assert "RINGTRAIN_SHIM_TEST" not in os.environ
    assert split_list(list(range(5)), 2) == [[0, 1, 2], [3, 4]]


@pytest.fixture
def no_horovod_module():
    """Leave ``import horovod`` as it was found: these tests put packages of that name on sys.path."""
    saved_path = list(sys.path)
    yield
    sys.path[:] = saved_path
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_only_a_horovod_other_than_the_shim_counts_as_real(tmp_path, no_horovod_module):
    assert not real_horovod_importable()  # none installed here
    sys.path.insert(0, str(SHIM_DIR))
    importlib.invalidate_caches()
    assert not real_horovod_importable()  # the shim itself is not "real Horovod"
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    assert real_horovod_importable()
    assert shim_pythonpath({"PYTHONPATH": "/mine"}) is None  # real Horovod wins: the shim stays out


def test_shim_pythonpath_puts_the_shim_first_once(no_horovod_module):
    shim = str(SHIM_DIR)
    assert shim_pythonpath({}) == shim
    assert shim_pythonpath({"PYTHONPATH": "/a:/b"}) == os.pathsep.join([shim, "/a", "/b"])
    assert shim_pythonpath({"PYTHONPATH": f"/a:{shim}"}) is None
    assert shim_pythonpath({"PYTHONPATH": "/a"}, enabled=False) is None
