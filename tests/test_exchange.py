"""The exchange methods: their bytes on the wire for a model's shapes, and the rule of --compression auto."""

from __future__ import annotations

import pytest

from ringtrain.exchange import (
    Method,
    choose,
    exchange_seconds,
    local_sgd,
    parse_compression,
    powersgd_compresses,
    ring_seconds,
    wire_cost,
)

#: A small CNN's gradients: two convolutions, their biases, a linear layer and its bias.
SHAPES = [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (10, 9216), (10,)]
ELEMENTS = 288 + 32 + 18432 + 64 + 92160 + 10


@pytest.mark.parametrize(("text", "label"), [
    ("none", "fp32"), ("fp32", "fp32"), ("FP16", "fp16"), ("bf16", "bf16"), ("powersgd", "powersgd:4"),
    (" powersgd:16 ", "powersgd:16"), ("auto", "auto"),
])
def test_compression_words(text, label):
    assert parse_compression(text).label == label


@pytest.mark.parametrize("text", ["zstd", "powersgd:", "powersgd:0", "powersgd:-2", "powersgd:x", "fp16:2"])
def test_a_bad_compression_word_names_the_value_and_the_fix(text):
    with pytest.raises(ValueError, match="HINT") as info:
        parse_compression(text)
    assert repr(text) in str(info.value)


def test_which_gradients_powersgd_compresses():
    # (n, m) = (64, 288): 18432 elements against 4 * 352 = 1408 for the factors, at least twice smaller
    assert powersgd_compresses((64, 32, 3, 3), 4)
    # (32, 9): 288 elements, factors 4 * 41 = 164: less than twice smaller
    assert not powersgd_compresses((32, 1, 3, 3), 4)
    assert not powersgd_compresses((64,), 1)  # a bias is never a matrix
    # (10, 9216): rank 4 pays, rank 5 would be more than the smaller side can hold (10 x 9226 x 5 x 2)
    assert powersgd_compresses((10, 9216), 4)
    assert not powersgd_compresses((10, 9216), 5)


def test_bytes_on_the_wire_per_method():
    fp32 = wire_cost(SHAPES, Method("none"))
    assert (fp32.gradient_bytes, fp32.bytes_per_step, fp32.ratio) == (4 * ELEMENTS, 4 * ELEMENTS, 1.0)
    fp16 = wire_cost(SHAPES, Method("fp16"))
    assert fp16.bytes_per_step == 2 * ELEMENTS
    assert fp16.ratio == 2.0
    low = wire_cost(SHAPES, Method("powersgd", rank=4))
    sent = 288 + 32 + 4 * (64 + 288) + 64 + 4 * (10 + 9216) + 10
    assert low.bytes_per_step == 4 * sent
    assert (low.compressed_tensors, low.tensors, low.exchanges_per_step) == (2, 6, 2.0)
    assert low.ratio == pytest.approx(ELEMENTS / sent)
    every8 = wire_cost(SHAPES, local_sgd(8))
    assert every8.bytes_per_step == 4 * ELEMENTS / 8
    assert every8.exchanges_per_step == 1 / 8
    assert "powersgd:4" in low.describe()
    assert "2 of 6 tensors compressed" in low.describe()


def test_the_ring_costs_nothing_on_one_rank_and_latency_per_round():
    assert ring_seconds(1, 1e9, 1e-3, 1e6) == 0.0
    assert ring_seconds(2, 1e6, 1e-3, 1e6) == pytest.approx(2e-3 + 1.0)
    assert ring_seconds(4, 0, 1e-3, 1e6, rounds=2) == pytest.approx(2 * 6e-3)
    low = wire_cost(SHAPES, Method("powersgd", rank=4))
    assert exchange_seconds(low, 2, 1e-3, 1e9) == pytest.approx(2 * 2e-3 + low.bytes_per_step / 1e9)


MBIT = 1e6 / 8


@pytest.mark.parametrize(("beta", "chosen"), [
    (100e9 / 8, "fp32"),     # 100 Gbit/s: the fp32 gradients take well under the budget
    (10e9 / 8, "fp16"),      # 10 Gbit/s: 94 MB of gradients take 75 ms, as fp16 38 ms
    (1e9 / 8, "powersgd:4"),  # 1 Gbit/s: only PowerSGD stays near the budget
    (100 * MBIT, "powersgd:4"),
])
def test_auto_chooses_from_the_link(beta, chosen):
    large = [(512, 512, 3, 3)] * 10 + [(512,)] * 10  # 94 MB of fp32 gradients, mostly large matrices
    choice = choose(large, 2, 50e-6, beta)
    assert choice.method.label == chosen
    assert "ms a step on this link" in choice.reason


def test_auto_takes_fp16_when_powersgd_would_not_shrink_the_model():
    thin = [(4, 200_000)] * 20  # matrices whose smaller side is below twice the rank: sent as they are
    choice = choose(thin, 2, 50e-6, 1e9 / 8)
    assert choice.method.label == "fp16"
    assert "would shrink them only" in choice.reason


def test_auto_on_one_rank_compresses_nothing():
    choice = choose(SHAPES, 1, 0.0, float("inf"))
    assert choice.method.label == "fp32"
    assert choice.reason == "one rank: no gradient crosses a link"
