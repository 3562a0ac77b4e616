"""DistributedOptimizer on real ranks: averaging, validation, accumulation, force-allreduce, warnings,
zero_grad guard, compression, sparse gradients, groups, GradScaler, size 1."""

from __future__ import annotations

import warnings

import pytest
import torch

import ringtrain as hvd
from ringtrain.engine.settings import Settings
from tests.ranks import run_ranks


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(6, 4, generator=gen), torch.randn(6, 2, generator=gen)


def _loss(model: torch.nn.Module, rank: int) -> torch.Tensor:
    x, y = _batch(rank)
    return torch.nn.functional.mse_loss(model(x), y)


def _reference_grads(world: int, passes: int = 1) -> list[torch.Tensor]:
    """The gradient each rank should see after averaging: mean over ranks of each rank's gradient."""
    grads = None
    for r in range(world):
        model = _model()
        for _ in range(passes):
            _loss(model, r).backward()
        local = [p.grad.clone() for p in model.parameters()]
        grads = local if grads is None else [a + b for a, b in zip(grads, local)]
    return [g / world for g in grads]


def averaged_step(compression_name: str, predivide: float) -> dict:
    hvd.init()
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                   compression=getattr(hvd.Compression, compression_name),
                                   gradient_predivide_factor=predivide)
    _loss(model, hvd.rank()).backward()
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    with opt.skip_synchronize():
        opt.step()
    return {"grads": grads, "dtypes": [g.dtype for g in grads], "params": [p.detach().clone() for p in
                                                                            model.parameters()],
            "isinstance": isinstance(opt, torch.optim.SGD), "name": type(opt).__name__,
            "expected": _reference_grads(hvd.size())}


@pytest.mark.parametrize(("compression", "predivide", "tol"),
                         [("none", 1.0, 1e-6), ("none", 2.0, 1e-6), ("fp16", 1.0, 2e-3), ("bf16", 1.0, 2e-2)])
def test_gradients_are_averaged(ranks2, compression, predivide, tol):
    results = ranks2.run(averaged_step, compression, predivide)
    for result in results:
        assert result["isinstance"]
        assert result["name"] == "SGD"
        assert result["dtypes"] == [torch.float32] * 4
        for got, want in zip(result["grads"], result["expected"]):
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)


def overlapped_step(setting: str) -> dict:
    from ringtrain.env.cores import usable_cores
    from tests.engine.hvd_env import fresh

    fresh({"RINGTRAIN_OVERLAP": setting})
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    _loss(model, hvd.rank()).backward()
    sent_in_backward = len(opt._bucket_handles)
    opt.step()
    free_core = hvd.local_size() * torch.get_num_threads() < usable_cores()
    return {"sent_in_backward": sent_in_backward, "buckets": len(opt._buckets), "free_core": free_core,
            "params": [p.detach().clone() for p in model.parameters()]}


def test_overlap_setting_decides_when_buckets_are_sent_and_never_the_result(ranks2):
    on, off, auto = (ranks2.run(overlapped_step, setting) for setting in ("on", "off", "auto"))
    for rank in range(2):
        assert on[rank]["sent_in_backward"] == on[rank]["buckets"] > 0  # every bucket left during backward
        assert off[rank]["sent_in_backward"] == 0  # all of them left in step()
        assert (auto[rank]["sent_in_backward"] > 0) is auto[rank]["free_core"]  # ringtrain/overlap.py
        for a, b, c in zip(on[rank]["params"], off[rank]["params"], auto[rank]["params"]):
            assert torch.equal(a, b)
            assert torch.equal(a, c)
    for a, b in zip(on[0]["params"], on[1]["params"]):
        assert torch.equal(a, b)


def validation_errors() -> dict[str, str]:
    hvd.init()
    model = _model()
    named = list(model.named_parameters())
    errors = {}

    def record(key, fn):
        try:
            fn()
        except (ValueError, NotImplementedError) as exc:
            errors[key] = f"{type(exc).__name__}: {exc}"

    def sgd():
        return torch.optim.SGD(model.parameters(), lr=0.1)
    record("dup", lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[named[0], named[0], *named[1:]]))
    record("dup_names", lambda: hvd.DistributedOptimizer(
        sgd(), named_parameters=[("same", p) for _, p in named]))
    record("not_tuple", lambda: hvd.DistributedOptimizer(sgd(), named_parameters=[p for _, p in named]))
    record("missing", lambda: hvd.DistributedOptimizer(sgd(), named_parameters=named[:2]))
    record("passes", lambda: hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0))
    record("predivide", lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Sum, gradient_predivide_factor=2.0))
    record("adasum", lambda: hvd.DistributedOptimizer(sgd(), op=hvd.Adasum, gradient_predivide_factor=2.0))
    record("groups_type", lambda: hvd.DistributedOptimizer(sgd(), groups="two"))
    record("groups_twice", lambda: hvd.DistributedOptimizer(sgd(), groups=[[named[0][1]], [named[0][1]]]))
    record("groups_elem", lambda: hvd.DistributedOptimizer(sgd(), groups=[[1.0]]))
    return errors


def test_validation_errors(ranks2):
    errors = ranks2.run(validation_errors)[0]
    assert "Parameter names in named_parameters must be unique. Found duplicates: 0.weight" in errors["dup"]
    assert "Found duplicates: same" in errors["dup_names"]
    assert "named_parameters should be a sequence of tuples (name, parameter)" in errors["not_tuple"]
    assert "named_parameters was specified, but one or more model parameters were not named" in \
        errors["missing"]
    assert errors["passes"] == "ValueError: backward_passes_per_step must be > 0"
    assert errors["predivide"] == "ValueError: gradient_predivide_factor not supported with op != Average"
    # op=Adasum works (tests/test_adasum_optimizer.py); only Average takes a predivide factor.
    assert errors["adasum"] == "ValueError: gradient_predivide_factor not supported with op != Average"
    assert errors["groups_type"].startswith("ValueError")
    assert errors["groups_twice"].startswith("ValueError")
    assert errors["groups_elem"].startswith("ValueError")


def default_names() -> list[str]:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    return [opt._parameter_names[p] for p in model.parameters()]


def test_default_parameter_names(ranks2):
    assert ranks2.run(default_names)[0] == [f"allreduce.noname.0.{j}" for j in range(4)]


def accumulation(passes: int) -> dict:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=passes)
    for _ in range(passes):
        _loss(model, hvd.rank()).backward()
    extra = None
    try:
        _loss(model, hvd.rank()).backward()
    except AssertionError as exc:
        extra = str(exc)
    opt.synchronize()
    got = [p.grad.clone() for p in model.parameters()]
    return {"extra": extra, "got": got}


def test_backward_passes_per_step(ranks2):
    results = ranks2.run(accumulation, 2)
    expected = _reference_grads(2, passes=2)
    for result in results:
        assert result["extra"] is not None
        assert result["extra"].startswith("Gradients were computed more than backward_passes_per_step times")
    # The refused third pass stopped in the last layer (its hooks fire first), so the first layer
    # holds exactly the average of two accumulated passes.
    for result in results:
        for got, want in zip(result["got"][:2], expected[:2]):
            torch.testing.assert_close(got, want)


def accumulation_ok(passes: int) -> list[torch.Tensor]:
    hvd.init()
    model = _model()
    # lr=0: parameters stay put, so the second round must give the same averaged gradient
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                   named_parameters=model.named_parameters(), backward_passes_per_step=1)
    opt.set_backward_passes_per_step(passes)
    for _ in range(passes):
        _loss(model, hvd.rank()).backward()
    opt.step()
    opt.zero_grad()
    # the counters were reset: a second round works too
    for _ in range(passes):
        _loss(model, hvd.rank()).backward()
    opt.synchronize()
    return [p.grad.clone() for p in model.parameters()]


def test_set_backward_passes_per_step(ranks2):
    results = ranks2.run(accumulation_ok, 3)
    for got, want in zip(results[0], _reference_grads(2, passes=3)):
        torch.testing.assert_close(got, want)


class _TwoBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = torch.nn.Linear(3, 1)
        self.sometimes = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, both: bool) -> torch.Tensor:
        out = self.used(x)
        return out + self.sometimes(x) if both else out


def force_allreduce() -> dict:
    hvd.init()
    model = _TwoBranches()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    x = torch.ones(2, 3)
    model(x, both=hvd.rank() == 0).sum().backward()
    opt.step()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def test_unused_parameters_are_allreduced_with_zeros(ranks2):
    results = ranks2.run(force_allreduce, timeout=120)
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name])
    # rank 0's gradient of the unused branch is 2 per weight (sum over 2 rows); rank 1 sent zeros
    torch.testing.assert_close(results[1]["sometimes.weight"], torch.ones(1, 3))
    torch.testing.assert_close(results[1]["used.weight"], torch.full((1, 3), 2.0))


def step_warnings() -> tuple[int, int, str]:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _loss(model, hvd.rank()).backward()
        opt.synchronize()
        opt.step()
    warned = [w for w in caught if issubclass(w.category, UserWarning)]
    opt.zero_grad()
    with warnings.catch_warnings(record=True) as caught2:
        warnings.simplefilter("always")
        _loss(model, hvd.rank()).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
    skipped = [w for w in caught2 if issubclass(w.category, UserWarning)]
    return len(warned), len(skipped), str(warned[0].message)


def test_step_after_synchronize_warns_once(ranks2):
    once, none, message = ranks2.run(step_warnings)[0]
    assert once == 1
    assert none == 0
    assert "optimizer.step() called without optimizer.skip_synchronize() context after " \
           "optimizer.synchronize()" in message


def zero_grad_guard() -> dict:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    _loss(model, hvd.rank()).backward()
    try:
        opt.zero_grad()
        refused = None
    except AssertionError as exc:
        refused = str(exc)
    opt.step()
    opt.zero_grad(set_to_none=True)
    after_none = all(p.grad is None for p in model.parameters())
    _loss(model, hvd.rank()).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    after_zero = all(p.grad is not None and not p.grad.any() for p in model.parameters())
    return {"refused": refused, "none": after_none, "zero": after_zero}


def test_zero_grad_guard_and_set_to_none(ranks2):
    result = ranks2.run(zero_grad_guard)[0]
    assert result["refused"].startswith("optimizer.zero_grad() was called after loss.backward() but before")
    assert result["none"]
    assert result["zero"]


def sparse_step(as_dense: bool) -> dict:
    hvd.init()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 3, sparse=True)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1),
                                   named_parameters=emb.named_parameters(), sparse_as_dense=as_dense)
    idx = torch.tensor([0, 1]) if hvd.rank() == 0 else torch.tensor([1, 4])
    emb(idx).sum().backward()
    opt.synchronize()
    grad = emb.weight.grad
    return {"sparse": grad.is_sparse, "dense": grad.to_dense().clone()}


@pytest.mark.parametrize("as_dense", [False, True])
def test_sparse_gradients(ranks2, as_dense):
    results = ranks2.run(sparse_step, as_dense)
    expected = torch.zeros(6, 3)
    expected[0] += 0.5
    expected[1] += 1.0
    expected[4] += 0.5
    for result in results:
        torch.testing.assert_close(result["dense"], expected)


def grouped_step(kind: str) -> dict:
    hvd.init()
    model = _model()
    params = list(model.parameters())
    groups = 2 if kind == "int" else [params[:2], params[2:]]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), groups=groups)
    _loss(model, hvd.rank()).backward()
    opt.synchronize()
    return {"grads": [p.grad.clone() for p in params], "groups": len(opt._groups)}


@pytest.mark.parametrize("kind", ["int", "lists"])
def test_groups(ranks2, kind):
    results = ranks2.run(grouped_step, kind)
    for result in results:
        assert result["groups"] == 2
        for got, want in zip(result["grads"], _reference_grads(2)):
            torch.testing.assert_close(got, want)


def scaler_and_scheduler() -> dict:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    for _ in range(2):
        opt.zero_grad()
        scaler.scale(_loss(model, hvd.rank())).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        scheduler.step()
    return {"lr": opt.param_groups[0]["lr"], "params": [p.detach().clone() for p in model.parameters()]}


def test_grad_scaler_and_lr_scheduler(ranks2):
    results = ranks2.run(scaler_and_scheduler)
    assert results[0]["lr"] == pytest.approx(0.025)
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)


def load_state_dict_resets() -> bool:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters())
    _loss(model, hvd.rank()).backward()
    opt.step()
    saved = opt.state_dict()
    _loss(model, hvd.rank()).backward()  # handles pending ...
    opt.synchronize()                    # ... (finish them on every rank so nothing is left in flight)
    opt.load_state_dict(saved)           # ... and forget the synchronized state
    opt.zero_grad()                      # no AssertionError: nothing pending after the load
    _loss(model, hvd.rank()).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no "step after synchronize" warning either
        opt.step()
    return True


def test_load_state_dict_resets_step_state(ranks2):
    assert ranks2.run(load_state_dict_resets) == [True, True]


def single_rank() -> dict:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    _loss(model, 0).backward()
    local = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return {"size": hvd.size(), "hooks": len(opt._hook_handles), "handles": len(opt._handles),
            "same": all(torch.equal(a, p.grad) for a, p in zip(local, model.parameters()))}


def test_single_rank_has_no_hooks_and_no_communication():
    result = run_ranks(1, single_rank)[0]
    assert result == {"size": 1, "hooks": 0, "handles": 0, "same": True}


def step_hooks_count() -> dict:
    hvd.init()
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    calls = {"pre": 0, "post": 0}
    opt.register_step_pre_hook(lambda *_: calls.__setitem__("pre", calls["pre"] + 1))
    opt.register_step_post_hook(lambda *_: calls.__setitem__("post", calls["post"] + 1))
    for step in range(3):
        opt.zero_grad()
        _loss(model, hvd.rank() + step).backward()
        opt.step()
    return calls


def test_step_hooks_run_once_per_step(ranks2):
    # torch wraps the step of the user's class and of the wrapper's: the wrapper must not run them twice
    assert ranks2.run(step_hooks_count) == [{"pre": 3, "post": 3}] * 2


def test_auto_buckets_follow_the_size_cap(monkeypatch):
    from ringtrain.optimizer import _DistributedOptimizer

    params = [torch.zeros(2**18) for _ in range(6)]  # 1 MiB each (float32)
    monkeypatch.setenv("RINGTRAIN_BUCKET_CAP_MB", "2")
    cap_mb = Settings.from_environ().bucket_cap_mb
    sizes = [len(b) for b in _DistributedOptimizer._auto_buckets(params, cap_mb)]
    assert sizes == [1, 2, 2, 1]  # a 1 MiB first bucket starts communication early
    monkeypatch.setenv("RINGTRAIN_BUCKET_CAP_MB", "0")
    cap_mb = Settings.from_environ().bucket_cap_mb
    assert [len(b) for b in _DistributedOptimizer._auto_buckets(params, cap_mb)] == [1] * 6


def process_set_step() -> dict:
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    try:
        subset = hvd.add_process_set([0, 2])
        model = _model()
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), process_set=subset)
        _loss(model, hvd.rank()).backward()
        opt.synchronize()
        grads = [p.grad.clone() for p in model.parameters()]
        hvd.remove_process_set(subset)
    finally:
        hvd.shutdown()
        hvd.init()
    return {"grads": grads, "hooks": len(opt._hook_handles)}


def test_process_set(ranks3):
    results = ranks3.run(process_set_step, timeout=180)
    assert results[1]["hooks"] == 0  # not a member: no hooks, its own gradient stays
    pair = []
    for r in (0, 2):
        model = _model()
        _loss(model, r).backward()
        pair.append([p.grad.clone() for p in model.parameters()])
    expected = [(a + b) / 2 for a, b in zip(*pair)]
    for rank in (0, 2):
        for got, want in zip(results[rank]["grads"], expected):
            torch.testing.assert_close(got, want)
    lonely = _model()
    _loss(lonely, 1).backward()
    for got, p in zip(results[1]["grads"], lonely.parameters()):
        torch.testing.assert_close(got, p.grad)


def test_refused_before_init():
    if hvd.is_initialized():
        pytest.skip("another test initialised ringtrain in the test process itself")
    model = _model()
    with pytest.raises(ValueError, match=r"hvd.init\(\)"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
