"""Sharded optimizer state (``DistributedOptimizer(..., shard_optimizer_state=True)``, ringtrain.sharding).

Without ranks: the ownership table, the moves of a re-shard, the shards' index, consolidate/split and
the report's line. On live ranks: sharded training takes the same steps as unsharded (SGD with
momentum, Adam, AdamW and more; 2 and 3 ranks; op, predivide, fp16, PowerSGD, accumulated passes, a
process set), each rank holds about 1/n of the state, GradScaler through synchronize/skip_synchronize,
the refusals on every rank, state dicts saved at 2 ranks resumed at 1 and 3, broadcast_optimizer_state,
and elastic re-shards when the world grows and shrinks.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn

import ringtrain as hvd
from ringtrain.sharding import (
    KEY,
    ShardingReport,
    assign_owners,
    consolidate,
    plan_moves,
    split,
)
from tests.ranks import free_port, run_ranks

# --- without ranks -----------------------------------------------------------------------------


def test_owners_are_balanced_by_elements_and_the_same_whatever_the_order():
    sizes = [("a", 100), ("b", 60), ("c", 50), ("d", 40), ("e", 10), ("f", 10)]
    owners = assign_owners(sizes, 2)
    assert owners == assign_owners(list(reversed(sizes)), 2)  # a pure function of names and sizes
    loads = [sum(n for name, n in sizes if owners[name] == r) for r in range(2)]
    assert sorted(loads) == [130, 140]  # largest first to the least loaded: a 100 | b 60, c 50, ...
    assert owners["a"] == 0  # ties go to the lower rank
    # equal sizes are dealt round-robin in name order
    assert assign_owners([(f"p{i}", 8) for i in range(6)], 3) == {f"p{i}": i % 3 for i in range(6)}


def test_every_parameter_has_one_owner_and_extra_ranks_own_nothing():
    sizes = [("w", 30), ("b", 3)]
    assert assign_owners(sizes, 1) == {"b": 0, "w": 0}
    assert assign_owners(sizes, 4) == {"b": 1, "w": 0}  # ranks 2 and 3 own nothing
    assert assign_owners([], 3) == {}
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        assign_owners(sizes, 0)


def test_a_re_shard_keeps_what_owners_hold_sends_the_rest_from_the_lowest_holder_and_names_the_lost():
    owners = {"a": 0, "b": 1, "c": 2, "d": 2, "e": 0}
    held = [["a", "b", "gone"], ["b", "c"], [], ["c"]]  # rank 2 joined with nothing; "gone" has no owner
    moves, lost = plan_moves(held, owners)
    assert moves == {1: {"c": 2}}  # a and b stay where they are; c from rank 1, the lowest of 1 and 3
    assert lost == ["d", "e"]
    assert plan_moves([[], []], {"a": 0}) == ({}, ["a"])


def _trained_adam() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    model[0].bias.requires_grad_(False)  # frozen: no owner, no state
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_split_then_consolidate_gives_the_unsharded_state_dict_back():
    model, opt = _trained_adam()
    whole = opt.state_dict()
    for world in (1, 2, 3):
        shards = split(whole, model.named_parameters(), world)
        assert [s[KEY]["rank"] for s in shards] == list(range(world))
        info = shards[0][KEY]
        assert info["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert set(info["owners"]) == {"0.weight", "2.weight", "2.bias"}  # the frozen bias has none
        held = [set(s[KEY]["state"]) for s in shards]
        assert set().union(*held) == {"0.weight", "2.weight", "2.bias"}
        assert sum(len(h) for h in held) == 3  # each in one shard only
        for s in shards:
            assert s["state"] == {}  # the state is under the shard's names only
            assert all(info["owners"][name] == s[KEY]["rank"] for name in s[KEY]["state"])
        back = consolidate(list(reversed(shards)))  # any order
        assert _same(back, whole)
        again = split(back, model.named_parameters(), world)
        assert _same(again, shards)


def test_consolidate_refuses_what_is_not_one_whole_world_with_a_hint():
    model, opt = _trained_adam()
    shards = split(opt.state_dict(), model.named_parameters(), 3)
    with pytest.raises(ValueError, match=r"ranks \[0, 2\].*HINT: save optimizer.state_dict\(\) on every"):
        consolidate([shards[0], shards[2]])
    with pytest.raises(ValueError, match="are not shards of a sharded optimizer.*HINT"):
        consolidate([opt.state_dict()])
    other = split(opt.state_dict(), [(f"x{i}", p) for i, p in enumerate(model.parameters())], 3)
    with pytest.raises(ValueError, match="name different parameters.*HINT"):
        consolidate([shards[0], shards[1], other[2]])
    with pytest.raises(ValueError, match="parameters' order|were named"):
        split(opt.state_dict(), list(model.named_parameters())[:2], 2)


def test_the_report_line_says_what_this_rank_holds():
    report = ShardingReport(sharded=True, rank=1, world_size=2, owned=("a", "b"), parameters=5,
                            owned_elements=4_000_000, total_elements=8_200_000, state_bytes=32_000_000,
                            state_bytes_by_rank=(33_600_000, 32_000_000))
    assert report.unsharded_state_bytes == 65_600_000
    assert str(report) == ("optimizer state sharded over 2 ranks: rank 1 owns 2 of 5 parameters (4.00M of "
                           "8.20M elements) and holds 32.0 MB of optimizer state, 0.49x the 65.6 MB "
                           "unsharded")
    empty = ShardingReport(sharded=True, rank=0, world_size=2, owned=(), parameters=1, owned_elements=0,
                           total_elements=3, state_bytes=0, state_bytes_by_rank=(0, 0))
    assert empty.state_fraction == 1.0


# --- on live ranks -----------------------------------------------------------------------------


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _loss(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 4, generator=gen)
    return nn.functional.mse_loss(model(x), y)


def _optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    params = model.parameters()
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    if kind == "adagrad":  # creates its state in __init__, for every parameter
        return torch.optim.Adagrad(params, lr=0.05)
    if kind == "rmsprop":
        return torch.optim.RMSprop(params, lr=0.01, momentum=0.5)
    if kind == "adafactor":  # not elementwise: factored second moments per matrix (torch >= 2.5)
        return torch.optim.Adafactor(params, lr=0.01)
    raise AssertionError(kind)


def _wrap(kind: str, model: nn.Module, shard: bool, **options) -> torch.optim.Optimizer:
    options = dict(options)
    if options.get("compression") is not None:
        name = options["compression"]
        options["compression"] = (hvd.Compression.powersgd(rank=2, start_iter=2) if name == "powersgd"
                                  else getattr(hvd.Compression, name))
    if options.get("op") is not None:
        options["op"] = getattr(hvd, options["op"])
    options = {k: v for k, v in options.items() if v is not None}
    return hvd.DistributedOptimizer(_optimizer(kind, model), named_parameters=model.named_parameters(),
                                    shard_optimizer_state=shard, **options)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range, passes: int = 1) -> None:
    for step in steps:
        opt.zero_grad()
        for p in range(passes):
            _loss(model, hvd.rank(), step * passes + p).backward()
        opt.step()


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _state_names(opt: torch.optim.Optimizer) -> list[str]:
    return sorted(opt._parameter_names[p] for p, entry in opt.state.items() if entry)


def sharded_and_plain(kinds: list[str], steps: int, passes: int = 1, plain_too: bool = True,
                      **options) -> dict:
    """Train each kind sharded (and unsharded, with ``plain_too``) ``steps`` steps on this rank."""
    hvd.init()
    out = {}
    for kind in kinds:
        model = _model()
        opt = _wrap(kind, model, True, backward_passes_per_step=passes, **options)
        _train(model, opt, range(steps), passes)
        report = opt.sharding_report()
        out[kind] = {"sharded": _params(model), "owned": report.owned, "held": _state_names(opt),
                     "bytes": report.state_bytes, "by_rank": report.state_bytes_by_rank, "line": str(report),
                     "isinstance": isinstance(opt, type(_optimizer(kind, _model())))}
        if plain_too:
            plain_model = _model()
            plain = _wrap(kind, plain_model, False, backward_passes_per_step=passes, **options)
            _train(plain_model, plain, range(steps), passes)
            out[kind].update(plain=_params(plain_model), plain_bytes=plain.sharding_report().state_bytes)
    return out


def _reference(kind: str, steps: int, world: int) -> dict:
    """What unsharded data parallelism computes, here in one process: the optimizer on the gradients
    averaged over ``world`` ranks' batches."""
    model = _model()
    opt = _optimizer(kind, model)
    for step in range(steps):
        grads = None
        for rank in range(world):
            model.zero_grad()
            _loss(model, rank, step).backward()
            mine = [q.grad.clone() for q in model.parameters()]
            grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
        for q, g in zip(model.parameters(), grads):
            q.grad = g / world
        opt.step()
    nbytes = sum(t.numel() * t.element_size() for entry in opt.state.values() for t in entry.values())
    return {"plain": _params(model), "plain_bytes": nbytes}


def _check_equivalent(results: list[dict], kinds: list[str], rtol: float = 1e-6, atol: float = 1e-7,
                      max_fraction: float | None = None) -> None:
    names = {name for name, _ in _model().named_parameters()}
    size = len(results)
    for kind in kinds:
        per_rank = [r[kind] for r in results]
        owned = [set(r["owned"]) for r in per_rank]
        assert set().union(*owned) == names, kind
        assert sum(len(o) for o in owned) == len(names), f"{kind}: a parameter with two owners"
        for rank, r in enumerate(per_rank):
            assert r["isinstance"]
            assert set(r["held"]) <= owned[rank], f"{kind}: rank {rank} holds state it does not own"
            assert sum(r["by_rank"]) == r["plain_bytes"], kind  # the shards add up to the unsharded state
            if max_fraction is not None:
                assert r["bytes"] <= max_fraction * r["plain_bytes"], (kind, r["line"])
            assert r["line"].startswith(f"optimizer state sharded over {size} ranks: rank {rank} owns ")
            for i, (got, want) in enumerate(zip(r["sharded"], r["plain"])):
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol,
                                           msg=f"{kind} rank {rank} param {i}")
            for got, first in zip(r["sharded"], per_rank[0]["sharded"]):
                assert torch.equal(got, first), f"{kind}: the ranks' models differ"


def test_sharded_sgd_adam_and_adamw_take_the_unsharded_steps_with_half_the_state(ranks2):
    kinds = ["sgd", "adam", "adamw"]
    results = ranks2.run(sharded_and_plain, kinds, 20, plain_too=False)  # the fast lane: no unsharded run
    for kind in kinds:
        reference = _reference(kind, 20, world=2)
        for result in results:
            result[kind].update(reference)
    _check_equivalent(results, kinds, max_fraction=0.55)


OTHER_OPTIMIZERS = ["adagrad", "rmsprop"] + (["adafactor"] if hasattr(torch.optim, "Adafactor") else [])


@pytest.mark.slow
def test_other_per_parameter_optimizers_take_the_unsharded_steps(ranks2):
    _check_equivalent(ranks2.run(sharded_and_plain, OTHER_OPTIMIZERS, 12), OTHER_OPTIMIZERS)


@pytest.mark.slow
@pytest.mark.parametrize(("options", "tolerance"), [
    ({"op": "Sum"}, 1e-6),
    ({"gradient_predivide_factor": 2.0}, 1e-6),
    ({"compression": "fp16"}, 1e-6),  # the same fp16 gradients, so the same steps
    ({"compression": "bf16", "groups": 2}, 1e-6),
    ({"compression": "powersgd"}, 1e-5),  # two plain steps, then compressed ones
], ids=["sum", "predivide", "fp16", "bf16-groups", "powersgd"])
def test_sharding_keeps_op_predivide_compression_groups_and_powersgd(ranks2, options, tolerance):
    kinds = ["adam"]
    _check_equivalent(ranks2.run(sharded_and_plain, kinds, 6, **options), kinds, rtol=tolerance,
                      atol=tolerance / 10)


@pytest.mark.slow
def test_accumulated_backward_passes_take_the_unsharded_steps(ranks2):
    kinds = ["adam", "sgd"]
    _check_equivalent(ranks2.run(sharded_and_plain, kinds, 6, passes=3), kinds)


@pytest.mark.slow
def test_three_ranks_take_the_unsharded_steps(ranks3):
    kinds = ["adam", "sgd"]
    # no bound on the fraction here: the model's largest tensor is more than a third of it
    _check_equivalent(ranks3.run(sharded_and_plain, kinds, 10), kinds)


def sharded_over_a_set() -> dict:
    from tests.engine.hvd_env import fresh

    fresh(process_sets="dynamic")
    try:
        subset = hvd.add_process_set([0, 2])
        out = {}
        for shard in (False, True):
            model = _model()
            opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                           named_parameters=model.named_parameters(), process_set=subset,
                                           shard_optimizer_state=shard)
            _train(model, opt, range(5))
            out[shard] = {"params": _params(model), "held": _state_names(opt)}
        hvd.remove_process_set(subset)
    finally:
        fresh()
    return out


@pytest.mark.slow
def test_a_process_set_shards_among_its_members(ranks3):
    results = ranks3.run(sharded_over_a_set, timeout=180)
    names = {name for name, _ in _model().named_parameters()}
    assert set(results[1][True]["held"]) == names  # not a member: trains alone, holds everything
    assert set(results[0][True]["held"]) | set(results[2][True]["held"]) == names
    assert not set(results[0][True]["held"]) & set(results[2][True]["held"])
    for rank in range(3):
        for got, want in zip(results[rank][True]["params"], results[rank][False]["params"]):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def scaled_steps(shard: bool) -> dict:
    hvd.init()
    model = _model()
    opt = _wrap("adam", model, shard)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    history = []
    for step in range(4):
        opt.zero_grad()
        loss = _loss(model, hvd.rank(), step)
        if step == 1 and hvd.rank() == 0:
            loss = loss * float("inf")  # rank 0 overflows: every rank must skip the step
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)  # the global norm: every rank has all grads
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        history.append((_params(model), scaler.get_scale()))
    return {"history": history, "held": _state_names(opt)}


@pytest.mark.slow
def test_grad_scaler_with_synchronize_and_skip_synchronize(ranks2):
    plain = ranks2.run(scaled_steps, False)
    sharded = ranks2.run(scaled_steps, True)
    for rank in range(2):
        params = [p for p, _ in sharded[rank]["history"]]
        assert [s for _, s in sharded[rank]["history"]] == [1024.0, 512.0, 512.0, 512.0]
        for a, b in zip(params[0], params[1]):
            assert torch.equal(a, b), f"rank {rank} stepped on the overflow"
        for (got, _), (want, _) in zip(sharded[rank]["history"], plain[rank]["history"]):
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        for a, b in zip(params[-1], [p for p, _ in sharded[0]["history"]][-1]):
            assert torch.equal(a, b)
    assert not set(sharded[0]["held"]) & set(sharded[1]["held"])


def refusals() -> dict:
    hvd.init()
    model = _model()
    errors = {}

    def record(key, fn):
        try:
            fn()
        except ValueError as exc:
            errors[key] = str(exc)

    record("lbfgs", lambda: hvd.DistributedOptimizer(torch.optim.LBFGS(model.parameters()),
                                                     named_parameters=model.named_parameters(),
                                                     shard_optimizer_state=True))
    record("adasum", lambda: hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                      named_parameters=model.named_parameters(),
                                                      op=hvd.Adasum, shard_optimizer_state=True))
    torch.manual_seed(0)
    emb = nn.Embedding(6, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(), shard_optimizer_state=True)
    record("sparse", lambda: emb(torch.tensor([0, 1 + hvd.rank()])).sum().backward())
    del opt
    # sparse_as_dense: exchanged dense, and sharding works (another embedding: the first keeps its hook)
    torch.manual_seed(0)
    emb = nn.Embedding(6, 3, sparse=True)
    dense = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                     named_parameters=emb.named_parameters(), sparse_as_dense=True,
                                     shard_optimizer_state=True)
    emb(torch.tensor([0, 1 + hvd.rank()])).sum().backward()
    dense.step()
    return {"errors": errors, "embedding": emb.weight.detach().clone()}


@pytest.mark.slow
def test_lbfgs_adasum_and_sparse_gradients_are_refused_on_every_rank(ranks2):
    results = ranks2.run(refusals)
    assert results[0]["errors"] == results[1]["errors"]
    errors = results[0]["errors"]
    assert set(errors) == {"lbfgs", "adasum", "sparse"}
    assert all("HINT:" in text for text in errors.values())
    assert errors["lbfgs"].startswith("shard_optimizer_state=True cannot shard torch.optim.LBFGS")
    assert "op=hvd.Adasum" in errors["adasum"]
    assert errors["sparse"].startswith("weight: a sparse gradient")
    assert "sparse_as_dense=True" in errors["sparse"]
    assert torch.equal(results[0]["embedding"], results[1]["embedding"])


# --- state dicts -------------------------------------------------------------------------------


def save_at(steps: int) -> dict:
    """Train sharded and unsharded Adam ``steps`` steps; every rank's shard and the unsharded state."""
    hvd.init()
    out = {}
    for shard in (False, True):
        model = _model()
        opt = _wrap("adam", model, shard)
        _train(model, opt, range(steps))
        out[shard] = {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict())}
    return out


def resume_from(saved: dict, start: int, steps: int) -> dict:
    """Resume the saved run four ways at this world size and train ``steps`` more steps."""
    hvd.init()
    shards, plain = saved["shards"], saved["plain"]
    ways = {"sharded from shards": (True, shards), "sharded from unsharded": (True, plain),
            "unsharded from unsharded": (False, plain), "unsharded from shards": (False, shards),
            "sharded from consolidated": (True, consolidate(shards))}
    out = {}
    for way, (shard, state) in ways.items():
        model = _model(seed=1)
        model.load_state_dict(saved["model"])
        opt = _wrap("adam", model, shard)
        opt.load_state_dict(copy.deepcopy(state))
        _train(model, opt, range(start, start + steps))
        out[way] = {"params": _params(model), "held": _state_names(opt)}
    return out


@pytest.mark.slow
def test_a_state_dict_saved_at_two_ranks_resumes_at_one_and_three_as_an_unsharded_one_does(ranks2, ranks3):
    saved = ranks2.run(save_at, 4)
    shards = [saved[rank][True]["opt"] for rank in range(2)]
    for rank, shard in enumerate(shards):
        info = shard[KEY]
        assert (info["world"], info["rank"]) == (2, rank)
        assert set(info["state"]) == {name for name, owner in info["owners"].items() if owner == rank}
    plain = saved[0][False]["opt"]
    assert _same(saved[1][False]["opt"], plain)  # unsharded, every rank holds the same
    whole = consolidate(shards)
    assert whole.keys() == plain.keys()
    assert whole["param_groups"] == plain["param_groups"]
    assert whole["state"].keys() == plain["state"].keys()
    for index, entry in plain["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(whole["state"][index][key], value, rtol=1e-6, atol=1e-8)
    names = [name for name, _ in _model().named_parameters()]
    assert _same(split(whole, [(n, p) for n, p in zip(names, _model().parameters())], 2), shards)
    for a, b in zip(saved[0][True]["model"].values(), saved[0][False]["model"].values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    state = {"shards": shards, "plain": plain, "model": saved[0][False]["model"]}
    at_three, at_one = ranks3.run(resume_from, state, 4, 3), run_ranks(1, resume_from, state, 4, 3)
    for world, results in ((3, at_three), (1, at_one)):
        for rank, result in enumerate(results):
            want = result["unsharded from unsharded"]["params"]
            for way, got in result.items():
                for a, b in zip(got["params"], want):
                    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{world} ranks, {way}")
            for way in ("sharded from shards", "sharded from unsharded", "sharded from consolidated"):
                held = result[way]["held"]
                if world == 1:
                    assert set(held) == set(names)
                else:
                    assert 0 < len(held) < len(names), (world, rank, way)


def load_errors() -> dict:
    hvd.init()
    model = _model()
    opt = _wrap("adam", model, True)
    _train(model, opt, range(2))
    mine = opt.state_dict()
    theirs = hvd.allgather_object(mine)
    errors = {}
    plain = _wrap("adam", _model(), False)
    attempts = {"other rank's shard": lambda: opt.load_state_dict(theirs[1 - hvd.rank()]),
                "lone shard into unsharded": lambda: plain.load_state_dict(mine),
                "other model": lambda: _wrap("adam", nn.Linear(3, 3), True).load_state_dict(theirs)}
    for key, fn in attempts.items():
        try:
            fn()
        except ValueError as exc:
            errors[key] = str(exc)
    opt.load_state_dict(mine)  # its own shard
    plain.load_state_dict(theirs)  # every rank's: consolidated
    return {"errors": errors, "plain": {p: sorted(e) for p, e in plain.state_dict()["state"].items()}}


@pytest.mark.slow
def test_a_shard_that_is_not_this_rank_s_is_refused_with_a_hint(ranks2):
    results = ranks2.run(load_errors)
    errors = results[0]["errors"]
    assert set(errors) == {"other rank's shard", "lone shard into unsharded", "other model"}
    assert all("HINT:" in text for text in errors.values())
    assert errors["other rank's shard"].startswith("this is the shard of rank 1 of 2; this is rank 0 of 2")
    assert "consolidate(shards)" in errors["lone shard into unsharded"]
    assert results[0]["plain"] == {i: ["exp_avg", "exp_avg_sq", "step"] for i in range(6)}


# --- broadcast_optimizer_state ------------------------------------------------------------------


def broadcast_then_train(shard: bool) -> dict:
    hvd.init()
    rank = hvd.rank()
    model = _model(seed=rank)  # every rank starts elsewhere
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1)),
                                   named_parameters=model.named_parameters(), shard_optimizer_state=shard)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    lr = opt.param_groups[0]["lr"]
    steps = sorted({int(entry["step"]) for entry in opt.state.values()})
    held = _state_names(opt)
    _train(model, opt, range(3))
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # again, with state: each owner keeps its own
    _train(model, opt, range(3, 6))
    return {"lr": lr, "steps": steps, "held": held, "params": _params(model), "after": _state_names(opt)}


@pytest.mark.slow
def test_broadcast_optimizer_state_takes_the_root_s_options_and_keeps_each_owner_s_state(ranks2):
    plain = ranks2.run(broadcast_then_train, False)
    sharded = ranks2.run(broadcast_then_train, True)
    names = {name for name, _ in _model().named_parameters()}
    assert [r["lr"] for r in sharded] == [0.01, 0.01]
    assert [r["steps"] for r in sharded] == [[1], [1]]  # the zero-gradient step made it, as unsharded
    assert set(sharded[0]["held"]) | set(sharded[1]["held"]) == names
    assert not set(sharded[0]["held"]) & set(sharded[1]["held"])
    for rank in range(2):
        assert sharded[rank]["after"] == sharded[rank]["held"]
        for a, b in zip(sharded[rank]["params"], plain[rank]["params"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


# --- elastic re-shards -------------------------------------------------------------------------

_PLACE = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")


def _join(rank: int, size: int, port: int) -> None:
    """Re-form the world in process (as an elastic reset does): this rank as ``rank`` of ``size``.

    Rank 0 hosts one job store per world size and keeps it (a world of one needs none), so a port
    serves every world of one size."""
    from tests.engine.hvd_env import fresh

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(size), "MASTER_PORT": str(port)})
    fresh({"HOROVOD_ELASTIC": "1"})


def _elastic_run(me: int, shard: bool, pair_port: int, trio_port: int) -> dict:
    model = opt = None
    out: dict = {}

    def build() -> None:
        nonlocal model, opt
        model = _model()
        opt = _wrap("adam", model, shard)

    def sync() -> None:  # what TorchState.sync() does after a reset
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)

    # a world of ranks 0 and 1 (rank 2 alone in a world of its own: its init count keeps up)
    _join(me if me < 2 else 0, 2 if me < 2 else 1, pair_port)
    if me < 2:
        build()
        sync()
        _train(model, opt, range(4))
        saved = copy.deepcopy(opt.state_dict())  # a commit
        opt.load_state_dict(saved)  # the restore after a failure, before the reset
    # grow: rank 2 joins with a fresh model and optimizer
    _join(me, 3, trio_port)
    if me == 2:
        build()
    sync()
    _train(model, opt, range(4, 7))
    out["grown"] = {"params": _params(model), "held": _state_names(opt)}
    saved = copy.deepcopy(opt.state_dict())
    opt.load_state_dict(saved)
    # shrink: rank 2 leaves, its state with it
    _join(me if me < 2 else 0, 2 if me < 2 else 1, pair_port)
    if me < 2:
        sync()
        _train(model, opt, range(7, 9))
        out["shrunk"] = {"params": _params(model), "held": _state_names(opt),
                         "steps": {opt._parameter_names[p]: int(e["step"]) for p, e in opt.state.items()}}
    return out


def elastic_reshards(pair_port: int) -> dict:
    saved = {name: os.environ.get(name) for name in _PLACE}
    me, trio_port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])  # this call's
    try:
        return {shard: _elastic_run(me, shard, pair_port, trio_port) for shard in (False, True)}
    finally:
        hvd.shutdown()
        os.environ.pop("HOROVOD_ELASTIC", None)
        for name, value in saved.items():
            if value is not None:
                os.environ[name] = value


@pytest.mark.slow
def test_an_elastic_reset_re_shards_to_the_new_owners_as_the_world_grows_and_shrinks(ranks3):
    results = ranks3.run(elastic_reshards, free_port(), timeout=240)
    names = {name for name, _ in _model().named_parameters()}
    grown = [r[True]["grown"] for r in results]
    assert set().union(*(g["held"] for g in grown)) == names
    assert sum(len(g["held"]) for g in grown) == len(names)  # each in one place: re-sharded over three
    assert grown[2]["held"]  # the rank that joined received state
    for rank in range(3):
        for a, b in zip(grown[rank]["params"], results[rank][False]["grown"]["params"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # as unsharded, where nothing is lost
    owned_by_2 = set(grown[2]["held"])
    shrunk = [results[rank][True]["shrunk"] for rank in range(2)]
    assert set(shrunk[0]["held"]) | set(shrunk[1]["held"]) == names
    for rank in range(2):
        steps = shrunk[rank]["steps"]
        for name, step in steps.items():
            # what rank 2 held left with it: started afresh two steps ago; the rest went on
            # (1 for broadcast_optimizer_state's zero-gradient step, then 4 + 3 + 2)
            assert step == (2 if name in owned_by_2 else 10), (name, step)
        for a, b in zip(shrunk[rank]["params"], shrunk[0]["params"]):
            assert torch.equal(a, b)
