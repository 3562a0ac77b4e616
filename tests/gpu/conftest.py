"""Fixtures of the GPU tests: a placement (device kind, ranks) with a live pool of ranks for it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.gpu.placements import (
    CUDA_PLACEMENTS,
    PAIRS,
    PLACEMENTS,
    Placement,
    pool_env,
    size_of,
    skip_unless_placeable,
)
from tests.hygiene import keep_across_tests
from tests.ranks import RankPool


@pytest.fixture(scope="session")
def gpu_pools(request: pytest.FixtureRequest) -> Iterator[dict[str, RankPool]]:
    """Pools by placement name, started on first use; ``cpu-2`` is the session's ``ranks2``."""
    pools: dict[str, RankPool] = {}
    yield pools
    for name, pool in pools.items():
        if name != "cpu-2":
            pool.close()


def _placement(request: pytest.FixtureRequest, pools: dict[str, RankPool]) -> Placement:
    name = request.param
    skip_unless_placeable(name)
    if name not in pools:
        pools[name] = (request.getfixturevalue("ranks2") if name == "cpu-2"
                       else keep_across_tests(RankPool(size_of(name), pool_env(name))))
    return Placement(name=name, kind=name.split("-")[0], size=size_of(name), pool=pools[name])


@pytest.fixture(params=PLACEMENTS)
def placement(request: pytest.FixtureRequest, gpu_pools: dict[str, RankPool]) -> Placement:
    """Every placement: cpu-1, cpu-2, cuda-1, cuda-2-shared, cuda-2-own."""
    return _placement(request, gpu_pools)


@pytest.fixture(params=PAIRS)
def pair(request: pytest.FixtureRequest, gpu_pools: dict[str, RankPool]) -> Placement:
    """The placements of two ranks."""
    return _placement(request, gpu_pools)


@pytest.fixture(params=CUDA_PLACEMENTS)
def cuda_placement(request: pytest.FixtureRequest, gpu_pools: dict[str, RankPool]) -> Placement:
    """The CUDA placements only."""
    return _placement(request, gpu_pools)


@pytest.fixture
def hidden_gpu_pool(gpu_pools: dict[str, RankPool]) -> Callable[[int], RankPool]:
    """``pool(size)``: ranks that see no GPU (``CUDA_VISIBLE_DEVICES=""``), as on a CPU-only machine."""

    def pool(size: int) -> RankPool:
        name = f"hidden-{size}"
        if name not in gpu_pools:
            gpu_pools[name] = keep_across_tests(RankPool(size, {"CUDA_VISIBLE_DEVICES": ""}))
        return gpu_pools[name]

    return pool
