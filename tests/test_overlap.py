"""The overlap policy of DistributedOptimizer (the ranks' side is in tests/test_optimizer.py)."""

from __future__ import annotations

import pytest

from ringtrain.overlap import should_overlap

LOCAL_CPU = {"world_size": 2, "local_size": 2, "on_gpu": False}


@pytest.mark.parametrize(("threads", "cores", "expected"), [
    (1, 2, False),   # 2 ranks x 1 thread take both cores: nothing is left to overlap on
    (2, 4, False),
    (1, 4, True),    # two cores idle: the engine thread runs beside the computation
    (1, 3, True),
    (4, 2, False),   # oversubscribed
])
def test_auto_overlaps_on_one_host_only_with_a_free_core(threads, cores, expected):
    assert should_overlap("auto", threads=threads, cores=cores, **LOCAL_CPU) is expected


def test_auto_overlaps_when_a_link_or_a_gpu_carries_the_gradients():
    assert should_overlap("auto", world_size=4, local_size=2, threads=1, cores=2, on_gpu=False)
    assert should_overlap("auto", world_size=2, local_size=2, threads=1, cores=2, on_gpu=True)


@pytest.mark.parametrize(("setting", "expected"), [("on", True), ("off", False)])
def test_on_and_off_override_the_policy(setting, expected):
    for threads, cores in ((1, 2), (1, 16)):
        assert should_overlap(setting, threads=threads, cores=cores, **LOCAL_CPU) is expected
    assert should_overlap(setting, world_size=8, local_size=1, threads=1, cores=2, on_gpu=True) is expected
