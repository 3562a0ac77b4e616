"""broadcast_parameters, broadcast_optimizer_state (every torch.optim optimizer), broadcast_object and
allgather_object on real ranks."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd

# Every optimizer in torch.optim (LBFGS is refused; SparseAdam needs sparse gradients; Muon 2-D params).
OPTIMIZERS = ["ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Muon", "NAdam",
              "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam"]


def test_every_torch_optimizer_is_covered():
    present = {name for name in dir(torch.optim)
               if isinstance(getattr(torch.optim, name), type)
               and issubclass(getattr(torch.optim, name), torch.optim.Optimizer)
               and name not in ("Optimizer", "LBFGS")}
    assert present <= set(OPTIMIZERS), f"new optimizers to cover: {present - set(OPTIMIZERS)}"


def test_generator_is_refused():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="invalid params of type: <class 'generator'>"):
        hvd.broadcast_parameters(model.parameters(), 0)


def broadcast_params(form: str) -> list[torch.Tensor]:
    hvd.init()
    torch.manual_seed(hvd.rank())  # different values per rank
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model[1].running_mean.add_(hvd.rank())
    if form == "state_dict":
        hvd.broadcast_parameters(model.state_dict(), root_rank=1)
    elif form == "named":
        hvd.broadcast_parameters(list(model.named_parameters()) + list(model.named_buffers()), root_rank=1)
    else:
        hvd.broadcast_parameters(list(model.parameters()) + list(model.buffers()), root_rank=1)
    return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]


@pytest.mark.parametrize("form", ["state_dict", "named", "list"])
def test_broadcast_parameters(ranks2, form):
    got = ranks2.run(broadcast_params, form)
    torch.manual_seed(1)
    assert len(got[0]) == 7
    for a, b in zip(got[0], got[1]):
        assert torch.equal(a, b)


def _make(name: str, rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    lr = 0.01 * (rank + 1)
    if name == "SparseAdam":
        model = torch.nn.Embedding(5, 3, sparse=True)
        return model, torch.optim.SparseAdam(model.parameters(), lr=lr), torch.tensor([0, 2, 2])
    model = torch.nn.Linear(3, 2, bias=name != "Muon")
    # Options differ per rank, but not the ones that change which state entries exist (amsgrad,
    # centered, ...): like Horovod, the ranks must agree on the state's structure.
    extra = {"SGD": {"momentum": 0.5 + 0.1 * rank, "nesterov": rank == 0},
             "Adam": {"betas": (0.9 - 0.01 * rank, 0.999), "amsgrad": True},
             "RMSprop": {"momentum": 0.1 * (rank + 1), "centered": True},
             "ASGD": {"t0": 10.0 + rank}}.get(name, {})
    opt = getattr(torch.optim, name)(model.parameters(), lr=lr, **extra)
    return model, opt, torch.randn(4, 3)


def _summary(opt: torch.optim.Optimizer) -> dict:
    groups = [{k: (type(v).__name__, repr(v)) for k, v in g.items() if k != "params"}
              for g in opt.param_groups]
    state = [{k: (type(v).__name__, v.clone() if torch.is_tensor(v) else v) for k, v in sorted(s.items())}
             for s in (opt.state[p] for g in opt.param_groups for p in g["params"])]
    return {"groups": groups, "state": state}


def optimizer_state(name: str, step_first: bool) -> dict:
    hvd.init()
    rank = hvd.rank()
    model, opt, x = _make(name, rank)
    if step_first:  # a real step with rank-dependent gradients: states differ
        (model(x).sum() * (rank + 1)).backward()
        opt.step()
    before = _summary(opt)
    hvd.broadcast_optimizer_state(opt, root_rank=0, model=model)
    return {"before": before, "after": _summary(opt)}


def _same(a: dict, b: dict) -> bool:
    if a["groups"] != b["groups"] or len(a["state"]) != len(b["state"]):
        return False
    for sa, sb in zip(a["state"], b["state"]):
        if sa.keys() != sb.keys():
            return False
        for key in sa:
            (ta, va), (tb, vb) = sa[key], sb[key]
            if ta != tb or (not torch.equal(va, vb) if torch.is_tensor(va) else va != vb):
                return False
    return True


@pytest.mark.parametrize("step_first", [True, False], ids=["stepped", "fresh"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_broadcast_optimizer_state(ranks2, name, step_first):
    root, other = ranks2.run(optimizer_state, name, step_first)
    assert not _same(root["before"], other["before"]), "the test needs ranks that start different"
    assert _same(root["after"], other["after"])
    # the root keeps its options, with their Python types
    assert root["after"]["groups"] == root["before"]["groups"]
    assert root["after"]["state"], "state was initialised"


def lbfgs_refused() -> str:
    hvd.init()
    model = torch.nn.Linear(2, 1)
    try:
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), 0)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_lbfgs_is_refused(ranks2):
    assert ranks2.run(lbfgs_refused) == ["cannot broadcast torch.optim.LBFGS state"] * 2


def stateless_sgd() -> float:
    hvd.init()
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1))
    hvd.broadcast_optimizer_state(opt, 0)
    return opt.param_groups[0]["lr"]


def test_stateless_optimizer_returns_early(ranks2):
    # SGD without momentum has no state: Horovod returns before broadcasting the options
    assert ranks2.run(stateless_sgd) == [pytest.approx(0.1), pytest.approx(0.2)]


def wrapped_adam_init() -> dict:
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, 0)
    step = opt.state[model.weight]["step"]
    # the state-creating step went through the base class: nothing is pending
    return {"step": float(step), "pending": len(opt._handles)}


def test_state_init_steps_through_the_base_optimizer(ranks2):
    assert ranks2.run(wrapped_adam_init) == [{"step": 1.0, "pending": 0}] * 2


class Payload:
    def __init__(self, value: object) -> None:
        self.value = value


def objects() -> dict:
    hvd.init()
    rank = hvd.rank()
    sent = {"rank": rank, "nested": [1, (2.5, "x")], "fn": lambda v: v + rank}
    got = hvd.broadcast_object(sent, root_rank=1)
    named = hvd.broadcast_object(Payload(rank * 10), root_rank=0, name="payload")
    gathered = hvd.allgather_object({"r": rank, "data": "x" * (rank * 1000)})
    return {"rank": got["rank"], "nested": got["nested"], "fn": got["fn"](1), "payload": named.value,
            "gathered": [(g["r"], len(g["data"])) for g in gathered]}


def test_broadcast_and_allgather_object(ranks2):
    for result in ranks2.run(objects):
        assert result == {"rank": 1, "nested": [1, (2.5, "x")], "fn": 2, "payload": 0,
                          "gathered": [(0, 0), (1, 1000)]}
