"""DistributedOptimizer(op=hvd.Adasum): Horovod's delta optimizer on real ranks, against one process that
simulates every rank's optimizer and combines their updates with the Adasum rule."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd
from tests.engine.hvd_env import ensure_init
from tests.engine.test_adasum import reference

STEPS = 3


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _batch(rank: int, step: int, part: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + 10 * rank + part)
    return torch.randn(8, 5, generator=gen), torch.randn(8, 2, generator=gen)


def _loss(model: torch.nn.Module, rank: int, step: int, part: int = 0) -> torch.Tensor:
    x, y = _batch(rank, step, part)
    return torch.nn.functional.mse_loss(model(x), y)


def _base(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if name == "Adam":
        return torch.optim.Adam(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _expected(world: int, opt_name: str, passes: int) -> list[torch.Tensor]:
    """Every rank's own optimizer steps from the shared parameters; the shared update is the Adasum of
    the ranks' updates, parameter by parameter."""
    models = [_model() for _ in range(world)]
    opts = [_base(opt_name, m) for m in models]
    for step in range(STEPS):
        start = [p.detach().clone() for p in models[0].parameters()]
        deltas = []
        for rank, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            for part in range(passes):
                _loss(model, rank, step, part).backward()
            opt.step()
            deltas.append([(p.detach() - s).double() for p, s in zip(model.parameters(), start)])
        combined = [torch.from_numpy(reference([d[i].reshape(-1).numpy() for d in deltas])).view_as(start[i])
                    for i in range(len(start))]
        for model in models:
            with torch.no_grad():
                for p, s, c in zip(model.parameters(), start, combined):
                    p.copy_(s + c.float())
    return [p.detach().clone() for p in models[0].parameters()]


def adasum_training(opt_name: str, passes: int, compression: str) -> dict:
    ensure_init()
    model = _model()
    opt = hvd.DistributedOptimizer(_base(opt_name, model), named_parameters=model.named_parameters(),
                                   op=hvd.Adasum, backward_passes_per_step=passes,
                                   compression=getattr(hvd.Compression, compression))
    for step in range(STEPS):
        opt.zero_grad()
        for part in range(passes):
            _loss(model, hvd.rank(), step, part).backward()
        opt.step()
    try:
        with opt.skip_synchronize():
            pass
        skip = ""
    except AssertionError as exc:
        skip = str(exc)
    return {"params": [p.detach().clone() for p in model.parameters()], "class": type(opt).__name__,
            "isinstance": isinstance(opt, type(_base(opt_name, _model()))), "skip": skip,
            "expected": _expected(hvd.size(), opt_name, passes)}


@pytest.mark.parametrize(("opt_name", "passes"), [("SGD", 1), ("Adam", 1), ("SGD", 2)])
@pytest.mark.parametrize("pool", ["ranks2", "ranks3"])
def test_delta_optimizer_matches_the_rule(request, pool, opt_name, passes):
    results = request.getfixturevalue(pool).run(adasum_training, opt_name, passes, "none")
    for result in results:
        assert result["isinstance"]
        assert result["class"] == opt_name
        assert result["skip"] == "Skipping synchronization is not supported when using Adasum optimizer."
        for got, want in zip(result["params"], result["expected"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for other in results[1:]:
        for a, b in zip(results[0]["params"], other["params"]):
            assert torch.equal(a, b)


def test_delta_optimizer_with_fp16_compression(ranks2):
    for result in ranks2.run(adasum_training, "SGD", 1, "fp16"):
        for got, want in zip(result["params"], result["expected"]):
            torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-4)
