"""The cores a process may use."""

from __future__ import annotations

import os

from ringtrain.env.cores import usable_cores


def test_usable_cores_counts_the_affinity_mask():
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert usable_cores() == len(os.sched_getaffinity(0))
