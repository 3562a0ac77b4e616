"""Gradient compression for allreduce: cast floating tensors to a 16-bit type on the wire.

``Compression.none``, ``Compression.fp16`` and ``Compression.bf16`` are classes with two static
methods, as in Horovod: ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx) -> tensor``.
Only floating-point tensors are cast; integer tensors pass through unchanged.

``Compression.powersgd(rank=4, ...)`` is not one of them: it returns a configuration of PowerSGD's
low-rank compression (:mod:`ringtrain.powersgd`), which only ``DistributedOptimizer`` takes.
"""

from __future__ import annotations

from typing import Any

import torch

from ringtrain.powersgd import PowerSGDConfig


class Compressor:
    """Interface: compress a tensor before a collective and restore it afterwards."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor to send and the context ``decompress`` needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Undo ``compress`` on the reduced tensor."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Send tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Return the tensor unchanged (ctx is None)."""
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Return the tensor unchanged."""
        return tensor


class CastCompressor(Compressor):
    """Cast floating tensors to ``wire_dtype``; ctx is the original dtype, ``decompress`` casts back."""

    wire_dtype: torch.dtype = torch.float16

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Cast a floating tensor to the wire dtype; other tensors pass through."""
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Cast back to the original floating dtype."""
        if ctx is not None and ctx.is_floating_point and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class FP16Compressor(CastCompressor):
    """Send floating tensors as float16 (halves the bytes; about 3 significant digits survive)."""

    wire_dtype = torch.float16


class BF16Compressor(CastCompressor):
    """Send floating tensors as bfloat16 (float32's range, about 2 significant digits)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``, ``Compression.bf16``, and
    ``Compression.powersgd(...)`` for ``DistributedOptimizer``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def powersgd(rank: int = 4, start_iter: int = 10, min_compression_rate: float = 2.0,
                 seed: int = 0) -> PowerSGDConfig:
        """PowerSGD (Vogels et al., NeurIPS 2019) for ``DistributedOptimizer(compression=...)``.

        Each gradient matrix (a tensor of two or more dimensions, seen as its first dimension by the
        rest) travels as two rank-``rank`` factors with error feedback; 1-D tensors and matrices whose
        factors would not be ``min_compression_rate`` times smaller travel as they are. The first
        ``start_iter`` steps are uncompressed. ``seed`` draws the first factors, the same on every rank.
        Works with ``op=hvd.Average`` or ``hvd.Sum``; any other collective refuses it. A ValueError
        names a value out of range.
        """
        return PowerSGDConfig(rank=rank, start_iter=start_iter, min_compression_rate=min_compression_rate,
                              seed=seed)


__all__ = [
    "BF16Compressor", "CastCompressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor",
    "PowerSGDConfig",
]
