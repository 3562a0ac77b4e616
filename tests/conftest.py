"""Shared fixtures: pools of real ranks, reused by every test of a session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ranks import RankPool


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
