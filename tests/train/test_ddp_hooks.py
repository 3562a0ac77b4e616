"""The DDP strategy's hooks: PowerSGD's state moved between DDP's bucket layouts, and merged across ranks."""

from __future__ import annotations

import torch

from ringtrain.train.ddp_hooks import BucketLayout, merge

#: a 64 x 64 matrix and a 64 x 8 one (compressed at rank 2), their biases and a 3 x 64 one (too small)
SHAPES = {"a.weight": (64, 8), "a.bias": (64,), "b.weight": (64, 64), "b.bias": (64,), "c.weight": (3, 64)}


def _flat(layout: BucketLayout, key: str, value_of: dict[str, float]) -> torch.Tensor:
    size = max(s.stop for s in layout.slices[key].values())
    flat = torch.full((size,), float("nan"))
    for name, there in layout.slices[key].items():
        flat[there] = value_of[name]
    return flat


def test_the_error_p_and_q_of_each_parameter_follow_it_into_another_bucket_order():
    forward = BucketLayout(list(SHAPES), SHAPES, rank=2, rate=2)
    backward = BucketLayout(list(reversed(SHAPES)), SHAPES, rank=2, rate=2)
    # torch compresses the two weights whose factors are more than twice smaller: (64+8)*2*2 < 512
    assert set(forward.slices["p"]) == {"a.weight", "b.weight"}
    assert forward.slices["error"]["a.bias"] == slice(512, 576)
    assert backward.slices["error"]["c.weight"] == slice(0, 192)
    # P: each matrix's n x r, grouped by shape in the order the shapes first appear
    first_two = (slice(0, 128), slice(128, 256))
    assert (forward.slices["p"]["a.weight"], forward.slices["p"]["b.weight"]) == first_two
    assert (backward.slices["p"]["b.weight"], backward.slices["p"]["a.weight"]) == first_two
    values = {name: float(i) for i, name in enumerate(SHAPES)}
    for key in ("error", "p", "q"):
        moved = forward.moved(key, _flat(forward, key, values), backward)
        assert torch.equal(moved, _flat(backward, key, values)), key


def _state(error: float, params: list[str]) -> dict:
    return {"iter": 12, "rank": 2, "rng": {}, "buckets": {
        "0": {"params": params, "error": torch.full((4,), error), "p": torch.ones(2), "q": torch.ones(3)}}}


def test_merged_error_feedback_is_the_mean_of_the_ranks_and_a_mismatch_drops_it():
    merged = merge([_state(1.0, ["x"]), _state(3.0, ["x"])])
    assert torch.equal(merged["buckets"]["0"]["error"], torch.full((4,), 2.0))
    assert merged["iter"] == 12
    other = merge([_state(1.0, ["x"]), _state(3.0, ["y"])])
    assert other["buckets"]["0"]["error"] is None  # laid out otherwise: no mean to take
