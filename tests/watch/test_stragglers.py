"""The straggler: the rank that arrives last at most collectives, from arrival times alone."""

from __future__ import annotations

import random

from ringtrain.watch.stragglers import MIN_COLLECTIVES, Arrivals


def feed(arrivals: Arrivals, count: int, late: dict[int, float], ranks=(0, 1, 2), start: int = 0,
         jitter: float = 0.002, seed: int = 0) -> None:
    rng = random.Random(seed)
    for seq in range(start, start + count):
        for rank in ranks:
            when = seq * 0.1 + late.get(rank, 0.0) + rng.uniform(0, jitter)
            arrivals.add(rank, [(seq, when)], set(ranks))


def test_a_rank_that_arrives_last_by_tens_of_milliseconds_is_the_straggler():
    arrivals = Arrivals()
    feed(arrivals, 100, {2: 0.040})
    found = arrivals.straggler()
    assert found is not None
    assert found.rank == 2
    assert found.share == 1.0
    assert 0.038 < found.late_s < 0.042
    assert "rank 2 on node3 is the slowest: it arrives last at 100 % of 100 collectives, 40 ms" in \
        found.line("node3")


def test_noise_alone_names_nobody():
    arrivals = Arrivals()
    feed(arrivals, 300, {}, jitter=0.005)
    assert arrivals.straggler() is None
    assert arrivals.summary() is None


def test_a_rank_last_by_microseconds_is_not_a_straggler():
    arrivals = Arrivals()
    feed(arrivals, 100, {1: 0.001}, jitter=0.0)
    assert arrivals.straggler() is None


def test_too_few_collectives_say_nothing_yet():
    arrivals = Arrivals()
    feed(arrivals, MIN_COLLECTIVES - 1, {1: 0.05})
    assert arrivals.straggler() is None
    feed(arrivals, 1, {1: 0.05}, start=MIN_COLLECTIVES - 1)
    assert arrivals.straggler() is not None


def test_a_collective_counts_once_every_rank_reported_it_and_repeats_are_ignored():
    arrivals = Arrivals()
    arrivals.add(0, [(1, 1.0)], {0, 1})
    assert arrivals.complete == 0
    arrivals.add(1, [(1, 1.5)], {0, 1})
    arrivals.add(1, [(1, 1.5)], {0, 1})  # the same arrival in the next record
    arrivals.add(0, [(1, 1.0)], {0, 1})
    assert arrivals.complete == 1
    assert arrivals.last_counts == {1: 1}


def test_the_window_follows_a_change_of_straggler_and_the_summary_keeps_the_whole_run():
    arrivals = Arrivals(window=100)
    feed(arrivals, 300, {1: 0.03})
    feed(arrivals, 100, {2: 0.03}, start=300)
    live = arrivals.straggler()
    assert live is not None
    assert live.rank == 2
    whole = arrivals.summary()
    assert whole is not None
    assert (whole.rank, whole.share, whole.collectives) == (1, 0.75, 400)
