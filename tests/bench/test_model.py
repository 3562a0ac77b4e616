"""The cost model against values worked out by hand (docs/bench.md has the formula)."""

import pytest

from ringtrain.bench.model import (
    INTERCONNECTS,
    Interconnect,
    StepModel,
    best_method,
    method_from_label,
    method_that_pays,
    parse_interconnect,
    predict,
    project,
    ring_allreduce_s,
)
from ringtrain.exchange import Method, local_sgd

FP16 = Method("fp16")
POWERSGD4 = Method("powersgd", rank=4)

MIB = 1024 * 1024
ALPHA, BETA = 1e-4, 1e8  # 100 us per message, 100 MB/s


def test_ring_allreduce():
    assert ring_allreduce_s(1, 1e9, ALPHA, BETA) == 0.0
    # p = 2: 2 messages of latency, n / beta of bytes
    assert ring_allreduce_s(2, 1e6, ALPHA, BETA) == pytest.approx(2e-4 + 0.01)
    # p = 4: 6 messages, 2 * 3/4 * n / beta
    assert ring_allreduce_s(4, 1e6, ALPHA, BETA) == pytest.approx(6e-4 + 0.015)


def test_buckets_follow_backward_order():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB)
    assert step.bucket_sizes() == [MIB, 0.5 * MIB]
    big = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=60 * MIB)
    assert big.bucket_sizes() == [MIB, 25 * MIB, 25 * MIB, 9 * MIB]
    assert StepModel(0.1, 0.06, 60 * MIB, FP16).bucket_sizes() == [0.5 * MIB, 12.5 * MIB, 12.5 * MIB,
                                                                        4.5 * MIB]
    assert StepModel(0.1, 0.06, 0.25 * MIB).bucket_sizes() == [0.25 * MIB]


def test_overlap_hides_all_but_the_last_bucket():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB)
    pred = predict(step, 2, ALPHA, BETA)
    # C = 2 buckets x 2 x 1e-4 + 1.5 MiB / 1e8 = 0.0004 + 0.01572864; L = 2e-4 + 0.5 MiB / 1e8
    assert pred.communication_s == pytest.approx(0.01612864)
    assert pred.exposed_s == pytest.approx(0.00544288)  # C - T_bwd < 0: only the last bucket shows
    assert pred.step_s == pytest.approx(0.10544288)
    assert pred.efficiency == pytest.approx(0.1 / 0.10544288)


def test_a_short_backward_pass_leaves_communication_exposed():
    step = StepModel(compute_s=0.1, backward_s=0.005, gradient_bytes=1.5 * MIB)
    pred = predict(step, 2, ALPHA, BETA)
    assert pred.exposed_s == pytest.approx(0.01612864 - 0.005)
    assert pred.efficiency == pytest.approx(0.1 / (0.1 + 0.01112864))


def test_fp16_halves_the_bytes_at_four_ranks():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB, method=FP16)
    pred = predict(step, 4, ALPHA, BETA)
    # 2 buckets x 6 messages x 1e-4 + 2 * 3/4 * 0.75 MiB / 1e8
    assert pred.communication_s == pytest.approx(1.2e-3 + 0.01179648)
    assert pred.exposed_s == pytest.approx(6e-4 + 1.5 * 0.25 * MIB / 1e8)


def test_oversubscription_slows_compute_and_widens_the_overlap_window():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB)
    pred = predict(step, 2, ALPHA, BETA, oversubscription=2.0)
    assert pred.compute_s == pytest.approx(0.2)
    assert pred.efficiency == pytest.approx(0.1 / (0.2 + 0.00544288))
    assert predict(step, 2, ALPHA, BETA, oversubscription=0.5).compute_s == pytest.approx(0.1)


def test_strong_scaling_divides_the_compute():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB, strong=True)
    pred = predict(step, 2, ALPHA, BETA)
    assert pred.compute_s == pytest.approx(0.05)
    assert pred.efficiency == pytest.approx(0.05 / (0.05 + 0.00544288))


def test_one_rank_is_the_baseline_and_latency_bound_is_flagged():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB)
    assert predict(step, 1, ALPHA, BETA).efficiency == 1.0
    assert predict(step, 1024, ALPHA, 1e12).latency_bound
    assert not predict(step, 2, 1e-9, BETA).latency_bound
    with pytest.raises(ValueError, match="HINT"):
        predict(step, 0, ALPHA, BETA)


def test_projection_covers_every_interconnect_and_falls_with_ranks():
    step = StepModel(compute_s=0.05, backward_s=0.03, gradient_bytes=45e6)
    table = project(step)
    assert [t["interconnect"] for t in table] == [i.name for i in INTERCONNECTS]
    for entry in table:
        effs = [p["efficiency"] for p in entry["points"]]
        assert [p["ranks"] for p in entry["points"]] == [8, 16, 32, 64, 128, 256, 512, 1024]
        assert all(0 < e <= 1 for e in effs)
        assert effs == sorted(effs, reverse=True)
    slow, fast = table[0]["points"][-1]["efficiency"], table[-1]["points"][-1]["efficiency"]
    assert slow < fast  # 25 GbE below NVLink


def test_parse_interconnect():
    link = parse_interconnect("roce=100:3")
    assert link.name == "roce"
    assert link.beta_bytes_per_s == pytest.approx(12.5e9)
    assert link.alpha_s == 3e-6
    for bad in ("roce", "roce=100", "roce=x:3", "=1:1", "a=-1:2"):
        with pytest.raises(ValueError, match="HINT"):
            parse_interconnect(bad)


def test_powersgd_sends_fewer_bytes_in_two_rounds_per_bucket():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB, method=POWERSGD4,
                     wire_ratio=10)
    assert step.bucket_sizes() == pytest.approx([0.1 * MIB, 0.05 * MIB])  # fp32's buckets, 10x smaller
    pred = predict(step, 2, ALPHA, BETA)
    # C = 2 rounds x 2 buckets x 2 x 1e-4 + 0.15 MiB / 1e8; L = 2 rounds x 2e-4 + 0.05 MiB / 1e8
    assert pred.communication_s == pytest.approx(8e-4 + 0.15 * MIB / 1e8)
    assert pred.exposed_s == pytest.approx(4e-4 + 0.05 * MIB / 1e8)
    assert pred.step_s == pytest.approx(0.1 + 4e-4 + 0.05 * MIB / 1e8)
    short = predict(StepModel(0.1, 0.001, 1.5 * MIB, POWERSGD4, wire_ratio=10), 2, ALPHA, BETA)
    assert short.exposed_s == pytest.approx(8e-4 + 0.15 * MIB / 1e8 - 0.001)
    with pytest.raises(ValueError, match="shapes. HINT: use StepModel.for_shapes"):
        StepModel(0.1, 0.06, 1.5 * MIB, POWERSGD4)  # its ratio depends on the shapes


def test_local_sgd_averages_once_every_h_steps_and_hides_none_of_it():
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB, method=local_sgd(8))
    assert step.bucket_sizes() == [1.5 * MIB]  # the deltas in one flat buffer, fp32
    pred = predict(step, 2, ALPHA, BETA)
    # A(2, 1.5 MiB) = 2e-4 + 0.01572864, once per 8 steps, after the step: the long backward hides nothing
    assert pred.exposed_s == pytest.approx((2e-4 + 0.01572864) / 8)
    assert pred.communication_s == pytest.approx(pred.exposed_s)
    assert pred.step_s == pytest.approx(0.1 + (2e-4 + 0.01572864) / 8)
    four = predict(step, 4, ALPHA, BETA)
    assert four.exposed_s == pytest.approx((6e-4 + 1.5 * 1.5 * MIB / 1e8) / 8)
    assert step.wire_bytes_per_step == 1.5 * MIB / 8


SHAPES = [(256, 1024), (256,), (64, 256), (64,)]
FP32_BYTES = 4 * (256 * 1024 + 256 + 64 * 256 + 64)
POWERSGD_BYTES = 4 * (4 * (256 + 1024) + 256 + 4 * (64 + 256) + 64)


def test_the_wire_bytes_of_each_method_come_from_the_shapes():
    powersgd = StepModel.for_shapes(0.1, 0.06, SHAPES, POWERSGD4)
    assert powersgd.gradient_bytes == FP32_BYTES
    assert powersgd.ratio == pytest.approx(FP32_BYTES / POWERSGD_BYTES)
    assert powersgd.wire_bytes == pytest.approx(POWERSGD_BYTES)
    assert powersgd.rounds == 2
    local = StepModel.for_shapes(0.1, 0.06, SHAPES, local_sgd(8))
    assert (local.ratio, local.wire_bytes, local.sync_every) == (1.0, FP32_BYTES, 8)
    assert StepModel.for_shapes(0.1, 0.06, SHAPES, FP16).ratio == 2.0
    assert StepModel.for_shapes(0.1, 0.06, SHAPES).ratio == 1.0


def test_best_method_orders_the_methods_by_predicted_step():
    # a 1 MB/s link without latency, 2 ranks: fp32 buckets of 1 MiB and the rest (66,816 bytes)
    result = best_method(0.1, 0.06, SHAPES, 2, 0.0, 1e6)
    assert list(result) == ["powersgd:4", "localsgd:8", "fp16", "fp32"]
    assert result["fp32"].step_s == pytest.approx(0.1 + FP32_BYTES / 1e6 - 0.06)
    assert result["fp16"].step_s == pytest.approx(0.1 + FP32_BYTES / 2e6 - 0.06)
    assert result["localsgd:8"].step_s == pytest.approx(0.1 + FP32_BYTES / 1e6 / 8)
    # PowerSGD's C (26,880 bytes: 27 ms) fits in the backward pass: only its last bucket shows
    last = (FP32_BYTES - MIB) * POWERSGD_BYTES / FP32_BYTES
    assert result["powersgd:4"].step_s == pytest.approx(0.1 + last / 1e6)
    # on a fast link nothing needs compressing: the order given breaks the tie
    fast = best_method(0.1, 0.06, SHAPES, 2, 0.0, 1e15, methods=["fp16", Method("none")])
    assert list(fast) == ["fp16", "fp32"]
    assert fast["fp32"].step_s == pytest.approx(0.1)


def test_method_labels():
    assert method_from_label("fp32") == Method("none")
    assert method_from_label("none") == Method("none")
    assert method_from_label("powersgd") == POWERSGD4
    assert method_from_label("localsgd:8") == local_sgd(8)
    assert method_from_label(FP16) is FP16
    for bad in ("localsgd", "localsgd:0", "auto", "zstd"):
        with pytest.raises(ValueError, match="HINT"):
            method_from_label(bad)


def test_the_method_that_pays_is_fp32_unless_another_is_5_percent_faster():
    slow = Interconnect("slow", "1 MB/s", 1e6, 0.0)
    fast = Interconnect("fast", "1 PB/s", 1e15, 0.0)
    steps = [StepModel.for_shapes(0.1, 0.06, SHAPES, m) for m in (Method("none"), FP16, local_sgd(8))]
    slow_entry, fast_entry = method_that_pays(steps, [slow, fast], ranks=(2,))
    (point,) = slow_entry["points"]
    assert (point["fastest"], point["pays"]) == ("localsgd:8", "localsgd:8")
    assert point["step_s"]["fp32"] == pytest.approx(predict(steps[0], 2, 0.0, 1e6).step_s)
    (point,) = fast_entry["points"]
    assert point["pays"] == "fp32"  # all within 5 %: the lossless method
    assert project(steps[2], (slow,))[0]["method"] == "localsgd:8"
