"""The worker actor's own methods, called on a plain instance (no cluster)."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray.worker import RayWorker


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.mark.usefixtures("isolated")
def test_join_job_sets_the_variables_and_the_horovod_folder_only_where_needed(tmp_path, monkeypatch) -> None:
    worker = RayWorker()
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no horovod importable here
    worker.join_job({"RANK": 3, "RINGTRAIN_JOB_SECRET": "stale"}, [], str(tmp_path))
    assert os.environ["RANK"] == "3"
    assert "RINGTRAIN_JOB_SECRET" not in os.environ  # no secret given: none left over either
    assert sys.path[0] == str(tmp_path)
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path)


@pytest.mark.usefixtures("isolated")
def test_join_job_leaves_an_importable_horovod_alone(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name: object())
    RayWorker().join_job({}, [], str(tmp_path))
    assert str(tmp_path) not in sys.path


@pytest.mark.usefixtures("isolated")
def test_env_vars_never_show_the_secret() -> None:
    os.environ["RINGTRAIN_JOB_SECRET"] = "s3cret"
    os.environ["RANK"] = "1"
    shown = RayWorker().env_vars()
    assert "RINGTRAIN_JOB_SECRET" not in shown
    assert shown["RANK"] == "1"


def test_the_executable_is_built_and_handed_to_functions() -> None:
    worker = RayWorker()
    assert worker.execute(lambda executable: executable) is None
    worker.start_executable(dict, [[("a", 1)]], {"b": 2})
    assert worker.execute(lambda executable: executable) == {"a": 1, "b": 2}
