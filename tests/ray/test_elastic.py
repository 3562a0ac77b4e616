"""Elastic Ray executors: ``ElasticRayExecutor`` and ``RayExecutor(min_workers=...)``.

Their settings are checked here, without a cluster. One run on a local Ray cluster (a stateful
``hvd.elastic.run`` function whose second worker dies once after a commit) is in
tests/ray/test_executor.py, on that module's cluster; the node-loss run of ``ringtrain run --ray
--min-np`` (the same machinery) is in tests/integration/test_ray_two_hosts.py.
"""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray import ElasticRayExecutor, RayExecutor  # noqa: E402
from ringtrain.ray.elastic import ElasticJob  # noqa: E402


@pytest.mark.parametrize(("kwargs", "match"), [({"min_num_proc": 0}, "min_num_proc=0"),
                                               ({"min_num_proc": 3, "max_num_proc": 2}, "below"),
                                               ({"reset_limit": -1}, "reset_limit=-1"),
                                               ({"cooldown_range": (5, 2)}, "cooldown_range=\\(5, 2\\)"),
                                               ({"elastic_timeout": 0}, "elastic_timeout=0"),
                                               ({"timeout_s": -1}, "timeout_s=-1")])
def test_bad_elastic_settings_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ElasticRayExecutor.create_settings(**kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"min_workers": 3, "max_workers": 2}, "max_workers=2 is below min_workers=3"),
    ({"min_workers": 0}, "min_workers=0"),
    ({"reset_limit": 2, "num_workers": 2}, "need min_workers"),
    ({"min_workers": 1, "num_hosts": 2}, "leave num_hosts out"),
])
def test_bad_elastic_executor_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RayExecutor(RayExecutor.create_settings(), **kwargs)


def test_an_elastic_executor_refuses_what_needs_long_lived_workers() -> None:
    executor = RayExecutor(RayExecutor.create_settings(), min_workers=1, max_workers=2)
    assert executor.settings.elastic
    with pytest.raises(NotImplementedError, match="executable_cls is not supported"):
        executor.start(executable_cls=object)
    with pytest.raises(NotImplementedError, match=r"execute\(\) is not supported by an elastic RayExecutor"):
        executor.execute(lambda _: None)
    with pytest.raises(RuntimeError, match=r"run\(\) before start\(\)"):
        executor.run(print)
    with pytest.raises(ValueError, match="gpus_per_slot=1 without use_gpu"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), gpus_per_slot=1)


def test_the_launcher_gets_every_setting_and_no_secret() -> None:
    job = ElasticJob(1, 4, 3, (10, 60), 30, 20, 0.5, 1, {"MY_VAR": "x"})
    argv = job.argv("10.0.0.1:6379", "10.0.0.1:5000")
    text = " ".join(argv)
    assert argv[1:6] == ["-m", "ringtrain", "run", "--ray", "10.0.0.1:6379"]
    for part in ("-np 1 --min-np 1", "--max-np 4", "--reset-limit 3", "--blacklist-cooldown-range 10 60",
                 "--elastic-timeout 30", "--start-timeout 20", "--ray-cpus-per-rank 0.5",
                 "--ray-gpus-per-rank 1", "-x MY_VAR"):
        assert part in text
    assert argv[-3:] == ["-m", "ringtrain.ray.elastic_call", "10.0.0.1:5000"]
    assert "SECRET" not in text


def test_elastic_ray_executor_hands_its_settings_to_the_job() -> None:
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, reset_limit=1,
                                                  cooldown_range=[5, 50], elastic_timeout=90, timeout_s=40)
    job = ElasticRayExecutor(settings, env_vars={"A": 1}, use_gpu=True, cpus_per_slot=2,
                             gpus_per_slot=0.5)._job
    assert (job.min_np, job.max_np, job.reset_limit, job.cooldown_range) == (2, 4, 1, (5, 50))
    assert (job.elastic_timeout, job.timeout_s, job.cpus_per_worker, job.gpus_per_worker) == (90, 40, 2, 0.5)
    assert job.env_vars == {"A": "1"}
    with pytest.raises(RuntimeError, match=r"ElasticRayExecutor.run\(\) before start\(\)"):
        ElasticRayExecutor(settings).run(print)
