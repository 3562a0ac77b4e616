"""Statistics for paired benchmark windows: competitors timed back to back, compared within each pair.

On a shared or virtual machine the speed drifts by more than the differences worth measuring. Timing
the two competitors in adjacent windows and taking the ratio inside each pair cancels the drift; the
median of the pair ratios with a bootstrap confidence interval then says how sure the comparison is.
"""

from __future__ import annotations

import random
import statistics


def pair_ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """``ours[i] / theirs[i]`` for windows timed back to back."""
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def bootstrap_ci(ratios: list[float], resamples: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of ``ratios`` (seeded: reports reproduce)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]
