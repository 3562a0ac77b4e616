"""SyncBatchNorm on 2 CPU ranks against nn.BatchNorm over the concatenated global batch."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd

SIZES = {"equal": (4, 4), "unequal": (3, 6)}


def _global_batch(shape_tail: tuple[int, ...], sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(sum(sizes), 3, *shape_tail, generator=gen) * 2 + 5  # a large mean tests stability
    w = torch.randn(sum(sizes), 3, *shape_tail, generator=gen)  # weights of the loss: uneven gradients
    return x, w


def _reference(shape_tail: tuple[int, ...], sizes: tuple[int, ...]) -> dict:
    x, w = _global_batch(shape_tail, sizes)
    x.requires_grad_(True)
    bn = torch.nn.BatchNorm1d(3) if len(shape_tail) <= 1 else torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    out = bn(x)
    (out * w).sum().backward()
    return {"out": out.detach(), "dx": x.grad, "dw": bn.weight.grad, "db": bn.bias.grad,
            "mean": bn.running_mean, "var": bn.running_var}


def sync_bn_step(shape_tail: tuple[int, ...], sizes: tuple[int, ...]) -> dict:
    hvd.init()
    rank = hvd.rank()
    x, w = _global_batch(shape_tail, sizes)
    start = sum(sizes[:rank])
    x = x[start:start + sizes[rank]].clone().requires_grad_(True)
    w = w[start:start + sizes[rank]]
    bn = hvd.SyncBatchNorm(3)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.0, 2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.0, -1.0, 3.0]))
    out = bn(x)
    (out * w).sum().backward()
    # weight/bias gradients stay local (the optimizer reduces them): sum them here to compare
    dw = hvd.allreduce(bn.weight.grad, name="test.sbn.dw", op=hvd.Sum)
    db = hvd.allreduce(bn.bias.grad, name="test.sbn.db", op=hvd.Sum)
    bn.eval()
    evaluated = bn(x.detach()).detach()
    return {"out": out.detach(), "dx": x.grad, "dw": dw, "db": db, "mean": bn.running_mean.clone(),
            "var": bn.running_var.clone(), "eval": evaluated, "x": x.detach()}


@pytest.mark.parametrize("shape_tail", [(), (5,), (2, 3)], ids=["NC", "NCL", "NCHW"])
@pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))
def test_matches_batch_norm_over_the_global_batch(ranks2, shape_tail, sizes):
    ref = _reference(shape_tail, sizes)
    results = ranks2.run(sync_bn_step, shape_tail, sizes)
    start = 0
    for rank, result in enumerate(results):
        rows = slice(start, start + sizes[rank])
        start += sizes[rank]
        torch.testing.assert_close(result["out"], ref["out"][rows], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(result["dx"], ref["dx"][rows], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result["dw"], ref["dw"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(result["db"], ref["db"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(result["mean"], ref["mean"])
        torch.testing.assert_close(result["var"], ref["var"])
        # eval mode uses the running statistics
        weight, bias = torch.tensor([1.0, 2.0, 0.5]), torch.tensor([0.0, -1.0, 3.0])
        expected = torch.nn.functional.batch_norm(result["x"], ref["mean"], ref["var"], weight, bias)
        torch.testing.assert_close(result["eval"], expected, atol=1e-5, rtol=1e-5)


def test_rejects_1d_input():
    with pytest.raises(ValueError, match="expected at least 2D input"):
        hvd.SyncBatchNorm(3)(torch.zeros(3))


def test_single_process_is_plain_batch_norm():
    # not initialised: behaves like BatchNorm on the local batch
    torch.manual_seed(0)
    x = torch.randn(8, 3, 4)
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    torch.testing.assert_close(sync(x), plain(x))
    torch.testing.assert_close(sync.running_var, plain.running_var)
    assert int(sync.num_batches_tracked) == 1
