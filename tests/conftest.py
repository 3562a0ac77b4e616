"""Shared fixtures: pools of real ranks, reused by every test of a session; the ``cuda`` marker's skip."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ordering import longest_modules_first
from tests.ranks import RankPool


def cuda_missing_reason() -> str | None:
    """Why the ``cuda`` tests cannot run here, or None when torch sees a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    return (f"needs a CUDA GPU: torch {torch.__version__} ({build}) sees none. HINT: run `python -m pytest "
            "-m cuda` on a machine with a GPU and a CUDA build of torch (docs/gpu.md)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the longest modules first (tests/ordering.py); skip every test marked ``cuda`` (also through a
    parameter's marks) where there is no GPU."""
    items[:] = longest_modules_first(items)
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
