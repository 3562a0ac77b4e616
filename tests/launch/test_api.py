"""``ringtrain.launch.api.run``: a Python function on real ranks, results in rank order."""

import os

import pytest

from ringtrain.launch.api import run


def rank_times(x):
    return int(os.environ["HOROVOD_RANK"]) * x, int(os.environ["HOROVOD_SIZE"])


def fails_on_rank_one():
    if os.environ["RANK"] == "1":
        raise KeyError("missing on rank one")
    return 0


@pytest.mark.slow
def test_results_in_rank_order_with_deprecated_np():
    assert run(rank_times, args=(10,), np=3) == [(0, 3), (10, 3), (20, 3)]


@pytest.mark.slow
def test_failure_raises_with_the_root_cause():
    with pytest.raises(RuntimeError, match="missing on rank one"):
        run(fails_on_rank_one, num_proc=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="more processes"):
        run(rank_times, args=(1,), num_proc=3, hosts="localhost:2")
    with pytest.raises(ValueError, match="elastic"):
        run(rank_times, args=(1,), min_np=1)
