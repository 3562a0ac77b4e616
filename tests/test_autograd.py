"""Horovod's autograd rules for the differentiable collectives (section 2 of the API notes)."""

from __future__ import annotations

import torch

import ringtrain.mpi_ops as hvd
from tests.engine.hvd_env import ensure_init


def _leaf(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(*shape).to(dtype).requires_grad_()


def _autograd_rules() -> None:
    ensure_init()
    rank, size = hvd.rank(), hvd.size()
    # allreduce: the gradient is the allreduce of the gradient with the same op.
    x = _leaf(4)
    hvd.allreduce(x, op=hvd.Sum).backward(torch.ones(4))
    assert x.grad.tolist() == [float(size)] * 4
    x = _leaf(4)
    hvd.allreduce(x).backward(torch.ones(4))
    assert x.grad.tolist() == [1.0] * 4
    x = _leaf(2)
    hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0).backward(torch.ones(2))
    assert x.grad.tolist() == [2.0 * size] * 2
    # grouped_allreduce: backward on each output separately; the others get zero gradients.
    tensors = [_leaf(3), _leaf(2, 2)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for out in outs:
        out.backward(torch.ones_like(out))
    assert all(t.grad.eq(size).all() for t in tensors)
    # allgather: averaged gradient, this rank's rows (ranks contribute different row counts).
    x = _leaf(rank + 1, 2)
    gathered = hvd.allgather(x)
    grad_ys = torch.arange(gathered.numel(), dtype=torch.float32).reshape(gathered.shape)
    gathered.backward(grad_ys)
    offset = sum(r + 1 for r in range(rank))
    assert torch.equal(x.grad, grad_ys[offset : offset + rank + 1])
    xs = [_leaf(rank + 1), _leaf(2, 3)]
    outs = hvd.grouped_allgather(xs)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert xs[0].grad.tolist() == [1.0] * (rank + 1)
    assert xs[1].grad.eq(1).all()
    # broadcast: the root gets the averaged gradient, the others zeros (global rank test).
    x = _leaf(3)
    hvd.broadcast(x, 1).backward(torch.ones(3))
    assert x.grad.tolist() == ([1.0] * 3 if rank == 1 else [0.0] * 3)
    # alltoall: gradients go back to their senders.
    x = _leaf(4, 2)
    out, received = hvd.alltoall(x, splits=[1, 3] if rank == 0 else [2, 2])
    assert not received.requires_grad
    out.backward(torch.ones_like(out))
    assert x.grad.eq(1).all()
    x = _leaf(4)
    hvd.alltoall(x).backward(torch.ones(4))
    assert x.grad.eq(1).all()
    # reducescatter: allgather of the gradient, times size for Sum; also float16 on CPU.
    for dtype in (torch.float32, torch.float16):
        x = _leaf(5, 2, dtype=dtype)
        out = hvd.reducescatter(x, op=hvd.Sum)
        out.backward(torch.ones_like(out))
        assert x.grad.dtype == dtype
        assert x.grad.eq(size).all()
        x = _leaf(5, 2, dtype=dtype)
        out = hvd.reducescatter(x)
        out.backward(torch.ones_like(out))
        assert x.grad.eq(1).all()
    xs = [_leaf(4), _leaf(3, 2)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert all(t.grad.eq(size).all() for t in xs)
    # In-place and async forms are not differentiable.
    y = torch.ones(2)
    assert not hvd.allreduce_(y).requires_grad


def test_autograd_rules(ranks2):
    ranks2.run(_autograd_rules)
