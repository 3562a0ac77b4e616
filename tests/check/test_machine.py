"""``ringtrain.check.machine``: the API checked, the device picked, and the identity part of a report."""

from __future__ import annotations

import pytest
import torch

import ringtrain
from ringtrain.check.machine import load_api, pick_device
from tests.check.stand_in import CPU


def test_load_api_is_the_package():
    assert load_api() is ringtrain
    assert callable(load_api().allreduce)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_pick_device_without_cuda():
    assert pick_device("auto", 0) == CPU
    assert pick_device("cpu", 5) == CPU
    with pytest.raises(ValueError, match="--device cuda was asked for but torch sees no CUDA device. HINT:"):
        pick_device("cuda", 0)
