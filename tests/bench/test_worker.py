"""How a built-in run is cut into epochs and steps."""

import pytest

from ringtrain.bench.worker import step_plan


def test_steps_fit_in_one_epoch():
    assert step_plan(10_000, 2, 64, warmup=5, steps=40, epochs=None) == (1, 45, [64] * 45)


def test_steps_span_epochs_of_equal_length_without_short_batches():
    # 1000 items on 2 ranks: 500 each, 7 whole batches of 64 (the short 8th is never used)
    epochs, per_epoch, items = step_plan(1000, 2, 64, warmup=2, steps=20, epochs=None)
    assert epochs == 4
    assert per_epoch == 6
    assert items == [64] * 24
    assert per_epoch <= 7
    assert epochs * per_epoch >= 22


def test_epochs_keep_the_short_last_batch():
    epochs, per_epoch, items = step_plan(1000, 2, 64, warmup=0, steps=None, epochs=2)
    assert (epochs, per_epoch) == (2, None)
    assert items == ([64] * 7 + [52]) * 2  # 500 per rank = 7 x 64 + 52


def test_too_few_items_for_one_batch():
    with pytest.raises(ValueError, match="needs at least 128 items.*HINT"):
        step_plan(100, 2, 64, warmup=0, steps=5, epochs=None)
