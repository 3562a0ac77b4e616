"""``SyncBatchNorm``: batch normalization with statistics computed over the whole global batch.

Unlike Horovod's (GPU only), this one also runs on CPU tensors. The forward pass gathers each rank's
(count, mean, sum of squared deviations) and combines them exactly (Chan's parallel formula, stable
even when means are large); the backward pass sum-allreduces the two per-channel sums the input
gradient needs. Weight and bias gradients stay local: the optimizer averages them like any other.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ringtrain import mpi_ops
from ringtrain.process_sets import ProcessSet, global_process_set


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """Shape a per-channel vector (C,) to broadcast against an (N, C, ...) input."""
    return t.view(1, -1, *([1] * (ndim - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float, process_set: ProcessSet) -> torch.Tensor:
        x = x.contiguous()
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        local_count = x.numel() // channels if channels else 0
        # Statistics in float64 at least: combining partial variances loses digits otherwise.
        stat_dtype = torch.float64
        xs = x.to(stat_dtype)
        if local_count > 0:
            local_mean = xs.mean(dims)
            local_m2 = ((xs - _channel_view(local_mean, x.dim())) ** 2).sum(dims)
        else:
            local_mean = xs.new_zeros(channels)
            local_m2 = xs.new_zeros(channels)
        packed = torch.cat([xs.new_tensor([float(local_count)]), local_mean, local_m2]).unsqueeze(0).cpu()
        gathered = mpi_ops.allgather(packed, name="sync_batch_norm.stats", process_set=process_set)
        counts = gathered[:, 0]
        means = gathered[:, 1:1 + channels]
        m2s = gathered[:, 1 + channels:]
        total = counts.sum()
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                             f"{list(x.shape)} on this rank and {int(total)} values in all. "
                             "HINT: use a larger batch or call model.eval().")
        mean = (counts[:, None] * means).sum(0) / total
        m2 = (m2s + counts[:, None] * (means - mean) ** 2).sum(0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None:
            unbiased = m2 / (total - 1)
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var), alpha=momentum)
        mean_d = mean.to(device=x.device, dtype=x.dtype)
        invstd_d = invstd.to(device=x.device, dtype=x.dtype)
        xhat = (x - _channel_view(mean_d, x.dim())) * _channel_view(invstd_d, x.dim())
        out = xhat
        if weight is not None:
            out = out * _channel_view(weight.to(x.dtype), x.dim())
        if bias is not None:
            out = out + _channel_view(bias.to(x.dtype), x.dim())
        ctx.save_for_backward(xhat, invstd_d, weight)
        ctx.total = float(total)
        ctx.process_set = process_set
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        xhat, invstd, weight = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        ndim = grad_out.dim()
        dims = [d for d in range(ndim) if d != 1]
        sum_dy = grad_out.sum(dims)
        sum_dy_xhat = (grad_out * xhat).sum(dims)
        grad_weight = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            channels = sum_dy.numel()
            packed = torch.cat([sum_dy, sum_dy_xhat]).to(torch.float64).cpu()
            reduced = mpi_ops.allreduce(packed, name="sync_batch_norm.grad", op=mpi_ops.Sum,
                                        process_set=ctx.process_set)
            reduced = reduced.to(device=grad_out.device, dtype=grad_out.dtype)
            mean_dy = reduced[:channels] / ctx.total
            mean_dy_xhat = reduced[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(invstd)
            grad_x = (grad_out - _channel_view(mean_dy, ndim)
                      - xhat * _channel_view(mean_dy_xhat, ndim)) * _channel_view(scale, ndim)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the global batch of every rank in ``process_set`` (CPU or GPU).

    Same constructor as ``torch.nn.BatchNorm*d`` and accepts inputs of shape (N, C, ...). In eval mode,
    or with a single rank, it is plain batch normalization.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input: torch.Tensor) -> None:  # torch's name
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _run_bn(self, input: torch.Tensor, factor: float) -> torch.Tensor:
        use_batch = self.training or self.running_mean is None
        keep = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if keep else None, self.running_var if keep else None,
                            self.weight, self.bias, use_batch, factor, self.eps)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize with global-batch statistics in training mode, running statistics otherwise."""
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not self.training or not mpi_ops.is_initialized() or self.process_set.size() in (None, 1):
            return self._run_bn(input, factor)
        track = self.track_running_stats
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias,
                                            self.running_mean if track else None,
                                            self.running_var if track else None,
                                            self.eps, factor, self.process_set)


__all__ = ["SyncBatchNorm"]
