"""Numerics of the executor that need no ranks: scaling rules and reducescatter splits."""

from __future__ import annotations

import torch

from ringtrain.engine.executor import reducescatter_rows, scale_


def test_integer_scaling_truncates_toward_zero():
    t = torch.tensor([5, -5, 7], dtype=torch.int32)
    scale_(t, 1 / 3)
    assert t.tolist() == [1, -1, 2]
    assert t.dtype == torch.int32


def test_half_precision_scales_in_float32():
    t = torch.tensor([2049.0], dtype=torch.float16)
    scale_(t, 0.5)
    assert t.dtype == torch.float16
    assert t.item() == 1024.0


def test_half_precision_scaling_rounds_once_like_a_float32_copy():
    for dtype in (torch.float16, torch.bfloat16):
        values = (torch.randn(100_000, generator=torch.Generator().manual_seed(0)) * 300).to(dtype)
        for factor in (0.5, 1 / 3, 0.1, 1 / 7, 3.0, 1e-3):
            scaled = values.clone()
            scale_(scaled, factor)
            reference = (values.to(torch.float32) * factor).to(dtype)
            assert torch.equal(scaled.view(torch.int16), reference.view(torch.int16)), (dtype, factor)


def test_unit_factor_is_a_no_op():
    t = torch.tensor([1.5])
    scale_(t, 1.0)
    assert t.item() == 1.5


def test_reducescatter_rows_give_extra_rows_to_the_first_ranks():
    assert reducescatter_rows(5, 2) == [3, 2]
    assert reducescatter_rows(7, 3) == [3, 2, 2]
    assert reducescatter_rows(2, 4) == [1, 1, 0, 0]


def test_fusion_buffer_is_reused_and_grows_to_the_largest_batch():
    from ringtrain.engine.executor import SetGroups, _fusion_buffer

    groups = SetGroups(set_id=0, ranks=[0], gloo=None, make_nccl=lambda: None)
    cpu = torch.device("cpu")
    first = _fusion_buffer(groups, torch.float32, cpu, 1000)
    assert first.numel() == 1000
    smaller = _fusion_buffer(groups, torch.float32, cpu, 10)
    assert smaller.numel() == 10
    assert smaller.data_ptr() == first.data_ptr()
    larger = _fusion_buffer(groups, torch.float32, cpu, 5000)
    assert larger.numel() == 5000
    assert len(groups.buffers) == 1
    groups.keep_bytes = 40_000
    beyond = _fusion_buffer(groups, torch.float32, cpu, 20_000)  # 80 kB: not kept
    assert beyond.numel() == 20_000
    assert groups.buffers[(torch.float32, cpu)].numel() == 5000
    other = _fusion_buffer(groups, torch.float16, cpu, 10)
    assert other.dtype == torch.float16
    assert len(groups.buffers) == 2
