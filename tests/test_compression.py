"""Compression: which tensors are cast, what ctx holds, and the round trip through allreduce."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd
from ringtrain.compression import BF16Compressor, Compression, Compressor, FP16Compressor, NoneCompressor


def test_none_passes_everything_through():
    t = torch.randn(3)
    sent, ctx = Compression.none.compress(t)
    assert sent is t
    assert Compression.none.decompress(sent, ctx) is t


@pytest.mark.parametrize(("compressor", "wire"), [(Compression.fp16, torch.float16),
                                                  (Compression.bf16, torch.bfloat16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_floating_tensors_are_cast_and_restored(compressor, wire, dtype):
    t = torch.linspace(-2, 2, 9, dtype=dtype)
    sent, ctx = compressor.compress(t)
    assert sent.dtype == wire
    assert ctx == dtype
    back = compressor.decompress(sent, ctx)
    assert back.dtype == dtype
    torch.testing.assert_close(back, t, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("compressor", [Compression.fp16, Compression.bf16])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_tensors_pass_through(compressor, dtype):
    t = torch.arange(5, dtype=dtype)
    sent, ctx = compressor.compress(t)
    assert sent is t
    assert compressor.decompress(sent, ctx) is t


def test_class_hierarchy():
    assert Compression.none is NoneCompressor
    assert Compression.fp16 is FP16Compressor
    assert Compression.bf16 is BF16Compressor
    for cls in (NoneCompressor, FP16Compressor, BF16Compressor):
        assert issubclass(cls, Compressor)
    with pytest.raises(NotImplementedError):
        Compressor.compress(torch.zeros(1))


def compressed_allreduce(name: str) -> tuple[torch.dtype, torch.Tensor]:
    hvd.init()
    t = torch.full((4,), 1.0 + hvd.rank(), dtype=torch.float64)
    out = hvd.allreduce(t, name=f"compressed.{name}", compression=getattr(Compression, name), op=hvd.Sum)
    return out.dtype, out


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_allreduce_with_compression_keeps_the_dtype(ranks2, name):
    for dtype, out in ranks2.run(compressed_allreduce, name):
        assert dtype == torch.float64
        torch.testing.assert_close(out, torch.full((4,), 3.0, dtype=torch.float64))
