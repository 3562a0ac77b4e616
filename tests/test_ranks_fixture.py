"""The rank fixture itself: results come back in order, failures and hangs are reported."""

import os
import time

import pytest

from tests.ranks import RankFailure, RankPool


def _whoami() -> tuple[int, int]:
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _fail_on_rank_one() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("boom on one")


def _sleep_forever() -> None:
    time.sleep(3600)


def test_results_in_rank_order(ranks2: RankPool) -> None:
    assert ranks2.run(_whoami) == [(0, 2), (1, 2)]


@pytest.mark.slow
def test_failure_carries_traceback() -> None:
    pool = RankPool(2)
    try:
        with pytest.raises(RankFailure, match="boom on one"):
            pool.run(_fail_on_rank_one)
        assert pool.run(_whoami) == [(0, 2), (1, 2)]
    finally:
        pool.close()


@pytest.mark.slow
def test_hang_is_reported_and_pool_recovers() -> None:
    pool = RankPool(2)
    try:
        with pytest.raises(RankFailure, match="did not answer"):
            pool.run(_sleep_forever, timeout=3)
        assert pool.run(_whoami) == [(0, 2), (1, 2)]
    finally:
        pool.close()
