"""Sparse gradients through DistributedOptimizer: kept sparse (allgather + coalesce) and equal to one process
training on the union of the ranks' batches."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd
from tests.engine.hvd_env import ensure_init

STEPS = 3
ROWS, WIDTH = 12, 4


def _indices(rank: int, step: int) -> torch.Tensor:
    """Rank r looks up r + 2 + step rows (uneven counts across ranks, repeats and overlaps included)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, ROWS, (rank + 2 + step,), generator=gen)


class _Model(torch.nn.Module):
    def __init__(self, with_dense: bool) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.embedding = torch.nn.Embedding(ROWS, WIDTH, sparse=True)
        self.head = torch.nn.Linear(WIDTH, 1) if with_dense else None

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        out = self.embedding(idx)
        if self.head is not None:
            out = self.head(out)
        return (out**2).sum()


def _optimizer(name: str, model: _Model) -> torch.optim.Optimizer:
    if name == "SparseAdam":
        return torch.optim.SparseAdam(list(model.parameters()), lr=0.05)
    return torch.optim.SGD(model.parameters(), lr=0.05)


def _reference(world: int, opt_name: str, with_dense: bool) -> list[torch.Tensor]:
    """One process: the gradient of the mean of every rank's loss, the same optimizer, the same steps."""
    model = _Model(with_dense)
    opt = _optimizer(opt_name, model)
    for step in range(STEPS):
        opt.zero_grad()
        loss = sum(model.loss(_indices(rank, step)) for rank in range(world)) / world
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def sparse_training(opt_name: str, with_dense: bool, as_dense: bool) -> dict:
    ensure_init()
    model = _Model(with_dense)
    opt = hvd.DistributedOptimizer(_optimizer(opt_name, model), named_parameters=model.named_parameters(),
                                   sparse_as_dense=as_dense)
    layouts = []
    for step in range(STEPS):
        opt.zero_grad()
        model.loss(_indices(hvd.rank(), step)).backward()
        opt.synchronize()
        grad = model.embedding.weight.grad
        layouts.append((grad.is_sparse, grad.is_sparse and grad.is_coalesced(),
                        sorted(grad.coalesce().indices()[0].tolist()) if grad.is_sparse else None))
        with opt.skip_synchronize():
            opt.step()
    return {"params": [p.detach().clone() for p in model.parameters()], "layouts": layouts,
            "expected": _reference(hvd.size(), opt_name, with_dense),
            "touched": [sorted(set(torch.cat([_indices(r, s) for r in range(hvd.size())]).tolist()))
                        for s in range(STEPS)]}


@pytest.mark.parametrize("as_dense", [False, True])
@pytest.mark.parametrize(("opt_name", "with_dense"), [("SparseAdam", False), ("SGD", True)])
@pytest.mark.parametrize("pool", ["ranks2", "ranks3"])
def test_sparse_gradients_match_one_process(request, pool, opt_name, with_dense, as_dense):
    results = request.getfixturevalue(pool).run(sparse_training, opt_name, with_dense, as_dense)
    for result in results:
        for got, want in zip(result["params"], result["expected"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for (is_sparse, coalesced, rows), touched in zip(result["layouts"], result["touched"]):
            assert is_sparse, "the optimizer must see a sparse gradient"
            assert coalesced, "the reduced sparse gradient must be coalesced (one entry per row)"
            assert rows == touched  # exactly the rows some rank looked up
    for other in results[1:]:
        for a, b in zip(results[0]["params"], other["params"]):
            assert torch.equal(a, b)


def unused_embedding_rank() -> dict:
    """Rank 1 does not use the embedding in the second step: it still takes part with an empty gradient."""
    ensure_init()
    model = _Model(with_dense=False)
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.05),
                                   named_parameters=model.named_parameters())
    for step in range(2):
        opt.zero_grad()
        if step == 0 or hvd.rank() == 0:
            model.loss(_indices(hvd.rank(), step)).backward()
        opt.step()
    return {"grad_rows": sorted(model.embedding.weight.grad.coalesce().indices()[0].tolist()),
            "rank0_rows": sorted(set(_indices(0, 1).tolist()))}


def test_rank_without_sparse_gradient_joins_with_empty_rows(ranks2):
    for result in ranks2.run(unused_embedding_rank):
        assert result["grad_rows"] == result["rank0_rows"]
