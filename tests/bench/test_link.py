"""Fitting latency and bandwidth to allreduce times of known sizes."""

import pytest

from ringtrain.bench.link import LinkFit, fit_link, format_rate, repeats_for


def test_exact_samples_give_back_alpha_and_beta():
    alpha, beta = 50e-6, 1.25e8
    samples = [(n, 2 * alpha + n / beta) for n in (4096, 65536, 1 << 20, 16 << 20)]
    fit = fit_link(samples)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert fit.max_relative_error == pytest.approx(0, abs=1e-9)
    assert len(fit.samples) == 4


def test_more_ranks_use_the_ring_factors():
    alpha, beta, p = 20e-6, 1e9, 4
    samples = [(n, 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / beta) for n in (1 << 12, 1 << 24)]
    fit = fit_link(samples, ranks=p)
    assert fit.alpha_s == pytest.approx(alpha)
    assert fit.beta_bytes_per_s == pytest.approx(beta)


def test_a_negative_intercept_is_clamped():
    fit = fit_link([(1000, 0.5e-6), (1_000_000, 1e-3)])
    assert fit.alpha_s == 0.0
    assert fit.beta_bytes_per_s > 0


@pytest.mark.parametrize("samples", [[(1, 1.0)], [(8, 1.0), (8, 2.0)], [(8, 2.0), (16, 1.0)]])
def test_useless_samples_are_refused(samples):
    with pytest.raises(ValueError, match="HINT"):
        fit_link(samples)


def test_round_trip_and_description():
    fit = LinkFit(alpha_s=1e-4, beta_bytes_per_s=1.25e8, hosts=["hostA", "hostB"])
    assert LinkFit.from_dict({**fit.as_dict(), "extra": 1}) == fit
    assert fit.describe() == "1 Gbit/s, 100 us latency (hostA-hostB)"
    assert format_rate(17.0102e9 / 8) == "17 Gbit/s"
    assert format_rate(117.4e6 / 8) == "117 Mbit/s"
    assert format_rate(12.5e6) == "100 Mbit/s"
    assert repeats_for(4096) >= repeats_for(16 << 20) >= 3
