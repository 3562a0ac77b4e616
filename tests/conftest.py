"""Shared fixtures: pools of real ranks, reused by every test of a session; the ``cuda`` marker's skip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ranks import RankPool

ROOT = Path(__file__).resolve().parent.parent


def cuda_missing_reason() -> str | None:
    """Why the ``cuda`` tests cannot run here, or None when torch sees a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return (f"needs a CUDA GPU: torch {torch.__version__} ({build}) sees none. HINT: run `python -m pytest "
            "-m cuda` on a machine with a GPU and a CUDA build of torch (docs/gpu.md)")


# Tests that share one machine-wide resource run on one xdist worker, in file order: the namespace
# hosts and the Slurm cluster of tests/integration/ (session fixtures: two workers would each build
# them with the same names), the local Ray cluster of tests/ray/ and the local Spark JVMs of
# tests/spark/ (one at a time is all two cores take).
_SHARED_RESOURCE_GROUPS = {"integration": "hosts", "ray": "ray", "spark": "spark"}


#: Modules elsewhere that start one of those resources too.
_SHARED_RESOURCE_MODULES = {"tests/launch/test_ray_driver.py": "ray"}


def _group_by_shared_resource(items: list[pytest.Item]) -> None:
    for item in items:
        top = item.path.parent.name
        group = _SHARED_RESOURCE_GROUPS.get(top) if item.path.parent.parent.name == "tests" else None
        group = group or _SHARED_RESOURCE_MODULES.get(item.path.relative_to(ROOT).as_posix())
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of shared resources for xdist; skip every test marked ``cuda`` (also through a
    parameter's marks) where there is no GPU."""
    _group_by_shared_resource(items)
    marked = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not marked:
        return
    reason = cuda_missing_reason()
    if reason is None:
        return
    for item in marked:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def ranks2() -> Iterator[RankPool]:
    """Two live ranks on gloo over loopback."""
    pool = RankPool(2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def ranks3() -> Iterator[RankPool]:
    """Three live ranks (odd sizes catch uneven splits)."""
    pool = RankPool(3)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def ranks4() -> Iterator[RankPool]:
    """Four live ranks, oversubscribed on a 2-core machine."""
    pool = RankPool(4)
    yield pool
    pool.close()
