"""``ElasticRayExecutor``: its settings are checked, then the constructor says what to use instead."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray import ElasticRayExecutor, RayExecutor  # noqa: E402


def test_elastic_executors_are_refused_naming_what_works() -> None:
    settings = ElasticRayExecutor.create_settings(min_num_proc=1, max_num_proc=4, ssh_identity_file="id")
    assert (settings.min_num_proc, settings.max_num_proc) == (1, 4)
    with pytest.raises(NotImplementedError, match=r"RayExecutor\(settings, num_workers=N\).*--min-np"):
        ElasticRayExecutor(settings, use_gpu=False, cpus_per_slot=1)
    with pytest.raises(NotImplementedError, match="min_workers, max_workers.*--min-np"):
        RayExecutor(RayExecutor.create_settings(), min_workers=1, max_workers=4)


@pytest.mark.parametrize(("kwargs", "match"), [({"min_num_proc": 0}, "min_num_proc=0"),
                                               ({"min_num_proc": 3, "max_num_proc": 2}, "below")])
def test_bad_elastic_settings_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ElasticRayExecutor.create_settings(**kwargs)
