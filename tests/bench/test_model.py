"""The cost model against values worked out by hand (docs/bench.md has the formula)."""

import pytest

from ringtrain.bench.model import (
    INTERCONNECTS,
    StepModel,
    parse_interconnect,
    predict,
    project,
    ring_allreduce_s,
)

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
    assert StepModel(0.1, 0.06, 60 * MIB, fp16=True).bucket_sizes() == [0.5 * MIB, 12.5 * MIB, 12.5 * MIB,
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
    step = StepModel(compute_s=0.1, backward_s=0.06, gradient_bytes=1.5 * MIB, fp16=True)
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
