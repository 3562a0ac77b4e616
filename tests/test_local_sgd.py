"""LocalSGD (Local SGD and DiLoCo): the anchor and outer-step arithmetic in a world of one, validation,
state, GradScaler, the wire layout; on two live ranks: equal parameters right after every averaging and
apart between them, H=1 as synchronous SGD, DiLoCo's outer momentum, buffers, fp16 on the wire, both
links (ringtrain's engine and torch.distributed on gloo), resuming from state dicts, the broadcasts that
start a job or follow an elastic reset."""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

import ringtrain as hvd
from ringtrain import local_sgd
from ringtrain.compression import Compressor

WORLD = 2


def _model(seed: int = 0, norm: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    if norm:
        return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    return nn.Linear(4, 2)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)


def _loss(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    x, y = _batch(rank, step)
    return nn.functional.mse_loss(model(x), y)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> list[list[torch.Tensor]]:
    """Take the steps; the parameters after each."""
    seen = []
    for step in steps:
        opt.zero_grad()
        _loss(model, rank, step).backward()
        opt.step()
        seen.append(_params(model))
    return seen


def _local_sgd_reference(world: int, steps: int, sync_every: int, lr: float, outer_lr: float = 1.0,
                         momentum: float = 0.0, inner_momentum: float = 0.0) -> list[torch.Tensor]:
    """``world`` virtual ranks in this process, the outer step by hand (Nesterov when momentum > 0)."""
    models = [_model() for _ in range(world)]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=inner_momentum) for m in models]
    anchor = _params(models[0])
    buf: list[torch.Tensor] | None = None
    for step in range(steps):
        for rank in range(world):
            _train(models[rank], opts[rank], rank, range(step, step + 1))
        if (step + 1) % sync_every:
            continue
        mean = [sum(a - ps[i] for ps in (_params(m) for m in models)) / world for i, a in enumerate(anchor)]
        if momentum > 0:
            buf = [g.clone() for g in mean] if buf is None else [momentum * b + g for b, g in zip(buf, mean)]
            update = [g + momentum * b for g, b in zip(mean, buf)]
        else:
            update = mean
        anchor = [a - outer_lr * u for a, u in zip(anchor, update)]
        for m in models:
            with torch.no_grad():
                for p, a in zip(m.parameters(), anchor):
                    p.copy_(a)
    return anchor


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol)


# --- a world of one: no link, the move is applied as it is ----------------------------------------

def test_a_subclass_of_the_users_optimizer_and_of_local_sgd():
    model = _model()
    base = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, base, 0, range(1))  # state to carry over
    opt = hvd.LocalSGD(base, sync_every=4)
    assert isinstance(opt, torch.optim.SGD)
    assert isinstance(opt, hvd.LocalSGD)
    assert type(opt).__name__ == "SGD"
    assert type(hvd.LocalSGD(torch.optim.SGD(_model().parameters(), lr=0.1), 2)) is type(opt)  # one class
    assert opt.state[model.weight]["momentum_buffer"] is base.state[model.weight]["momentum_buffer"]
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _train(model, opt, 0, range(1, 2))
    scheduler.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert (opt.sync_every, opt.steps, opt.syncs, opt.compression) == (4, 1, 0, "none")


def test_between_averagings_the_anchor_stays_and_at_one_the_parameters_are_the_mean():
    model = _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=3)
    start = _params(model)
    plain_model = _model()
    plain = _train(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.1), 0, range(3))
    seen = _train(model, opt, 0, range(2))
    _assert_close(seen[0], plain[0], 0)  # local steps are plain SGD steps
    _assert_close(seen[1], plain[1], 0)
    _assert_close(opt.anchor_state(), start, 0)  # not averaged yet after steps 1 and 2...
    assert (opt.steps, opt.syncs) == (2, 0)
    seen += _train(model, opt, 0, range(2, 3))
    assert (opt.steps, opt.syncs) == (3, 1)
    _assert_close(seen[2], plain[2], 1e-6)  # ...and at step 3 the mean of one rank is its parameters
    _assert_close(opt.anchor_state(), seen[2], 0)


def test_nesterov_outer_step_equals_the_hand_computation():
    model = _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2, outer_lr=0.7,
                       outer_momentum=0.9)
    _train(model, opt, 0, range(6))
    want = _local_sgd_reference(1, 6, 2, lr=0.1, outer_lr=0.7, momentum=0.9)
    _assert_close(_params(model), want, 1e-6)
    outer = opt.outer_optimizer
    assert isinstance(outer, torch.optim.SGD)
    assert outer.param_groups[0]["nesterov"] is True
    assert opt.config() == {"sync_every": 2, "outer": "SGD", "outer_lr": 0.7, "outer_momentum": 0.9,
                            "nesterov": True, "compression": "none", "model_buffers": False}


def test_diloco_and_an_outer_optimizer_function_are_the_same_outer_step():
    runs = []
    for build in (
        lambda opt: hvd.LocalSGD.diloco(opt, sync_every=2),
        lambda opt: hvd.LocalSGD(opt, 2, outer_optimizer=functools.partial(
            torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)),
    ):
        model = _model()
        opt = build(torch.optim.SGD(model.parameters(), lr=0.1))
        _train(model, opt, 0, range(4))
        runs.append(_params(model))
    _assert_close(runs[0], runs[1], 0)
    _assert_close(runs[0], _local_sgd_reference(1, 4, 2, lr=0.1, outer_lr=0.7, momentum=0.9), 1e-6)


def test_every_step_with_outer_sgd_lr_one_is_plain_local_training():
    model, plain_model = _model(), _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), sync_every=1)
    seen = _train(model, opt, 0, range(5))
    plain = _train(plain_model, torch.optim.SGD(plain_model.parameters(), lr=0.05, momentum=0.9), 0, range(5))
    for got, want in zip(seen, plain):
        _assert_close(got, want, 1e-6)
    assert opt.syncs == 5


def test_step_hooks_run_once_per_step():
    model = _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    _train(model, opt, 0, range(2))
    assert calls == ["pre", "post"] * 2


def test_a_step_the_grad_scaler_skips_still_counts():
    model, plain_model = _model(), _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    before = _params(model)
    opt.zero_grad()
    scaler.scale(_loss(model, 0, 0) * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    assert opt.steps == 1  # skipped, counted
    _assert_close(_params(model), before, 0)
    assert not hasattr(opt, "grad_scale")  # GradScaler's attributes are gone after the call
    opt.zero_grad()
    scaler.scale(_loss(model, 0, 1)).backward()
    scaler.step(opt)  # unscaled by LocalSGD, then stepped; the second step averages
    scaler.update()
    _train(plain_model, plain, 0, range(1, 2))
    assert (opt.steps, opt.syncs) == (2, 1)
    _assert_close(_params(model), _params(plain_model), 1e-6)
    # unscale_ first (clipping), then step: no second unscale
    opt.zero_grad()
    scaler.scale(_loss(model, 0, 2)).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    _train(plain_model, plain, 0, range(2, 3))
    _assert_close(_params(model), _params(plain_model), 1e-6)


def test_state_dict_holds_the_wrapped_state_and_the_wrappers():
    model = _model()
    opt = hvd.LocalSGD.diloco(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sync_every=2)
    _train(model, opt, 0, range(3))
    state = opt.state_dict()
    assert set(state) == {"state", "param_groups", local_sgd.STATE_KEY}
    mine = state[local_sgd.STATE_KEY]
    assert set(mine) == {"sync_every", "steps", "syncs", "anchor", "outer", "config"}
    assert (mine["sync_every"], mine["steps"], mine["syncs"]) == (2, 3, 1)
    _assert_close(mine["anchor"], opt.anchor_state(), 0)
    assert mine["outer"]["state"][0]["momentum_buffer"].shape == model.weight.shape
    assert mine["config"]["outer_lr"] == pytest.approx(0.7)

    other_model = _model(seed=1)
    other = hvd.LocalSGD.diloco(torch.optim.SGD(other_model.parameters(), lr=0.1, momentum=0.9), sync_every=2)
    other.load_state_dict(state)
    assert (other.steps, other.syncs) == (3, 1)
    _assert_close(other.anchor_state(), opt.anchor_state(), 0)
    torch.testing.assert_close(other.outer_optimizer.state_dict()["state"][0]["momentum_buffer"],
                               mine["outer"]["state"][0]["momentum_buffer"])
    assert not torch.equal(other_model.weight, model.weight)  # the parameters are the model's business
    other.reset_to_anchor()  # ...or the last averaged ones
    _assert_close(_params(other_model), opt.anchor_state(), 0)
    assert local_sgd.STATE_KEY in state  # the caller's dict is left whole

    plain = torch.optim.SGD(_model().parameters(), lr=0.1, momentum=0.9)
    other.load_state_dict(plain.state_dict())  # a plain optimizer's state: the wrapped one only
    assert other.steps == 3

    wrong = hvd.LocalSGD(torch.optim.SGD(nn.Linear(5, 2).parameters(), lr=0.1), sync_every=2)
    with pytest.raises(ValueError, match=r"saved anchor has 2 tensors of shapes \[\(2, 4\), \(2,\)\].*HINT"):
        wrong.load_state_dict(state)


def test_anchor_follows_added_parameter_groups_and_skips_frozen_parameters():
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].bias.requires_grad_(False)
    opt = hvd.LocalSGD(torch.optim.SGD(model[0].parameters(), lr=0.1), sync_every=1)
    assert [tuple(a.shape) for a in opt.anchor_state()] == [(3, 4)]
    opt.add_param_group({"params": list(model[1].parameters())})
    assert [tuple(a.shape) for a in opt.anchor_state()] == [(3, 4), (2, 3), (2,)]
    assert len(opt.outer_optimizer.param_groups) == 2
    x = torch.randn(5, 4)
    model(x).sum().backward()
    opt.step()
    _assert_close(opt.anchor_state(), [model[0].weight.detach(), model[1].weight.detach(),
                                       model[1].bias.detach()], 1e-6)


def test_broadcast_state_alone_makes_the_parameters_the_anchor():
    model = _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=4)
    _train(model, opt, 0, range(2))
    opt.broadcast_state()
    _assert_close(opt.anchor_state(), _params(model), 0)
    assert opt.steps == 2


class _Recorder(local_sgd._Link):
    """A link of two ranks whose averages are the values themselves; it records what would travel."""

    world = 2

    def __init__(self) -> None:
        self.sent: list[tuple[str, torch.dtype, int]] = []

    def average_(self, buffers):
        self.sent.extend((name, t.dtype, t.numel()) for name, t in buffers)


@pytest.mark.parametrize(("compression", "wire"), [
    (None, torch.float32), (hvd.Compression.fp16, torch.float16), ("bf16", torch.bfloat16)])
def test_one_flat_buffer_per_dtype_the_deltas_cast_the_buffers_not(monkeypatch, compression, wire):
    recorder = _Recorder()
    monkeypatch.setattr(local_sgd, "_link", lambda group: recorder)
    model = _model(norm=True)
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1, model=model,
                       compression=compression)
    _train(model, opt, 0, range(1))
    params = sum(p.numel() for p in model.parameters())  # 15 + 6 + 8
    if wire == torch.float32:  # the deltas and the running statistics share one buffer
        assert recorder.sent == [(f"LocalSGD.0.float32.{params + 6}", torch.float32, params + 6)]
    else:
        assert recorder.sent == [(f"LocalSGD.0.{str(wire)[6:]}.{params}", wire, params),
                                 ("LocalSGD.1.float32.6", torch.float32, 6)]  # num_batches_tracked stays


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sync_every": 0}, r"LocalSGD\(sync_every=0\): .*a positive int\. HINT: sync_every=1"),
    ({"sync_every": -3}, r"sync_every=-3\)"),
    ({"sync_every": 2.5}, r"sync_every=2\.5\)"),
    ({"sync_every": True}, r"sync_every=True\)"),
    ({"sync_every": "8"}, r"sync_every='8'\)"),
    ({"outer_lr": -0.5},
     r"LocalSGD\(outer_lr=-0\.5\): .*finite number > 0\. HINT: .*DiLoCo uses outer_lr=0\.7"),
    ({"outer_lr": float("nan")}, r"outer_lr=nan\)"),
    ({"outer_lr": float("inf")}, r"outer_lr=inf\)"),
    ({"outer_lr": 0}, r"outer_lr=0\)"),
    ({"outer_momentum": -0.1}, r"LocalSGD\(outer_momentum=-0\.1\): .*up to, not including, 1\. HINT"),
    ({"outer_momentum": 1.0}, r"outer_momentum=1\.0\)"),
    ({"outer_momentum": float("nan")}, r"outer_momentum=nan\)"),
    ({"compression": "int8"}, r"LocalSGD\(compression='int8'\): .*HINT: other compressors"),
    ({"compression": Compressor}, r"LocalSGD\(compression=Compressor\)"),
    ({"outer_optimizer": lambda p: torch.optim.SGD(p, lr=0.7), "outer_lr": 0.7},
     r"not both\. HINT: drop outer_lr/outer_momentum"),
    ({"outer_optimizer": lambda p: torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=1.0)},
     r"must hold exactly the tensors it was given .*HINT"),
])
def test_validation_names_the_value_and_the_fix(kwargs, message):
    kwargs = {"sync_every": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        hvd.LocalSGD(torch.optim.SGD(_model().parameters(), lr=0.1), **kwargs)


def test_validation_of_types_and_of_wrapping_twice():
    opt = hvd.LocalSGD(torch.optim.SGD(_model().parameters(), lr=0.1), sync_every=4)
    with pytest.raises(ValueError, match=r"already wrapped in LocalSGD.*HINT"):
        hvd.LocalSGD(opt, sync_every=4)
    with pytest.raises(TypeError, match=r"expected a torch.optim.Optimizer\. HINT"):
        hvd.LocalSGD(_model(), sync_every=4)
    sgd = torch.optim.SGD(_model().parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"outer_optimizer=SGD\): expected a function .*HINT"):
        hvd.LocalSGD(sgd, 4, outer_optimizer=torch.optim.SGD(_model().parameters(), lr=0.7))
    with pytest.raises(TypeError, match=r"returned list, not a torch.optim.Optimizer"):
        hvd.LocalSGD(sgd, 4, outer_optimizer=lambda params: params)
    with pytest.raises(TypeError, match=r"model=Tensor"):
        hvd.LocalSGD(sgd, 4, model=torch.zeros(1))
    with pytest.raises(ValueError, match=r"sync_every=0"):
        opt.sync_every = 0
    opt.sync_every = 2
    assert opt.config()["sync_every"] == 2


# --- two live ranks ---------------------------------------------------------------------------------

@contextlib.contextmanager
def _joined(backend: str) -> Iterator[int]:
    """ringtrain's engine, or a gloo default group of torch.distributed (the pool's engine stopped first)."""
    if backend == "engine":
        hvd.init()
        yield hvd.rank()
        return
    hvd.shutdown()
    dist.init_process_group("gloo")
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


def averaging_schedule(backend: str) -> dict:
    with _joined(backend) as rank:
        model = _model()
        opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=3)
        seen = _train(model, opt, rank, range(7))
        opt.sync()  # out of schedule, e.g. before an evaluation
        seen.append(_params(model))
        _train(model, opt, rank, range(7, 9))  # the schedule did not move: step 9 averages
        seen.append(_params(model))
        return {"seen": seen, "steps": opt.steps, "syncs": opt.syncs}


@pytest.mark.parametrize("backend", ["engine", "torch"])
def test_parameters_agree_right_after_each_averaging_and_drift_between(ranks2, backend):
    results = ranks2.run(averaging_schedule, backend)
    for index, (a, b) in enumerate(zip(results[0]["seen"], results[1]["seen"])):
        same = all(torch.equal(x, y) for x, y in zip(a, b))
        assert same is (index in (2, 5, 7, 8)), index  # steps 3 and 6, the explicit sync, step 9
    assert [(r["steps"], r["syncs"]) for r in results] == [(9, 4)] * 2


def h1_steps(backend: str, steps: int) -> list[torch.Tensor]:
    with _joined(backend) as rank:
        model = _model()
        opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1)
        _train(model, opt, rank, range(steps))
        return _params(model)


@pytest.mark.parametrize("backend", ["engine", "torch"])
def test_every_step_averaging_is_synchronous_sgd(ranks2, backend):
    steps = 4
    results = ranks2.run(h1_steps, backend, steps)
    model = _model()  # synchronous SGD: the ranks' gradients at the same parameters, averaged
    for step in range(steps):
        grads = []
        for rank in range(WORLD):
            model.zero_grad()
            _loss(model, rank, step).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.sub_(0.1 * sum(g[i] for g in grads) / WORLD)
    for result in results:
        _assert_close(result, _params(model), 1e-6)


def diloco_steps(backend: str, compression: str, steps: int) -> dict:
    with _joined(backend) as rank:
        model = _model()
        opt = hvd.LocalSGD.diloco(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), sync_every=2,
                                  compression=compression)
        _train(model, opt, rank, range(steps))
        return {"params": _params(model), "buf": [opt.outer_optimizer.state[a]["momentum_buffer"].clone()
                                                  for a in opt.outer_optimizer.param_groups[0]["params"]]}


@pytest.mark.parametrize(("backend", "compression", "tol"), [
    ("engine", "none", 1e-6), ("torch", "none", 1e-6), ("engine", "fp16", 2e-3), ("torch", "fp16", 2e-3),
    ("engine", "bf16", 2e-2)])
def test_diloco_outer_momentum_over_two_ranks(ranks2, backend, compression, tol):
    results = ranks2.run(diloco_steps, backend, compression, 6)
    want = _local_sgd_reference(WORLD, 6, 2, lr=0.1, outer_lr=0.7, momentum=0.9, inner_momentum=0.5)
    for result in results:
        _assert_close(result["params"], want, tol)
    for a, b in zip(results[0]["params"] + results[0]["buf"], results[1]["params"] + results[1]["buf"]):
        assert torch.equal(a, b)  # whatever the wire, every rank applies the same mean


def buffers_averaged(backend: str) -> dict:
    with _joined(backend) as rank:
        model = _model(norm=True)
        opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2, model=model)
        _train(model, opt, rank, range(1))
        if rank == 1:
            model(_batch(rank, 99)[0])  # one more batch through BatchNorm: its count differs
        opt.zero_grad()
        _loss(model, rank, 1).backward()
        norm = model[1]
        before = {"mean": norm.running_mean.clone(), "var": norm.running_var.clone()}
        opt.step()  # the second step averages
        after = {"mean": norm.running_mean.clone(), "var": norm.running_var.clone(),
                 "count": int(norm.num_batches_tracked)}
        return {"after": after, "before": before}


@pytest.mark.parametrize("backend", ["engine", "torch"])
def test_floating_buffers_are_averaged_integer_ones_kept(ranks2, backend):
    results = ranks2.run(buffers_averaged, backend)
    a, b = results[0]["after"], results[1]["after"]
    for name in ("mean", "var"):
        assert torch.equal(a[name], b[name])
        want = (results[0]["before"][name] + results[1]["before"][name]) / 2
        torch.testing.assert_close(a[name], want, atol=1e-6, rtol=1e-6)
        assert not torch.equal(results[0]["before"][name], results[1]["before"][name])
    assert (a["count"], b["count"]) == (2, 3)  # num_batches_tracked: each rank's own


def resumed_steps() -> dict:
    hvd.init()
    rank = hvd.rank()

    def build(model: nn.Module) -> hvd.LocalSGD:
        return hvd.LocalSGD.diloco(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sync_every=3)

    straight = _model()
    _train(straight, build(straight), rank, range(12))
    first = _model()
    opt = build(first)
    _train(first, opt, rank, range(7))
    saved = {"model": {k: v.clone() for k, v in first.state_dict().items()},
             "opt": torch.load(_roundtrip(opt.state_dict()), weights_only=True)}  # plain data: a safe load
    second = _model(seed=5)
    second.load_state_dict(saved["model"])
    resumed = build(second)
    resumed.load_state_dict(saved["opt"])
    _train(second, resumed, rank, range(7, 12))
    return {"straight": _params(straight), "resumed": _params(second), "steps": resumed.steps,
            "syncs": resumed.syncs}


def _roundtrip(state: dict) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_state_dicts_resume_exactly(ranks2):
    for result in ranks2.run(resumed_steps):
        _assert_close(result["resumed"], result["straight"], 1e-6)
        assert (result["steps"], result["syncs"]) == (12, 4)


def broadcasts_from_rank0() -> dict:
    from ringtrain.elastic import TorchState

    hvd.init()
    rank = hvd.rank()
    model = _model(seed=rank)  # ranks apart on purpose
    opt = hvd.LocalSGD.diloco(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sync_every=100)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # alone: parameters, anchor, counts, outer state
    start = {"params": _params(model), "anchor": opt.anchor_state(), "steps": opt.steps}
    _train(model, opt, rank, range(3 + rank))  # different step counts, as a new world's ranks might have
    opt.sync()  # outer momentum...
    if rank == 1:
        opt.outer_optimizer.state.clear()  # ...that a rank which just joined would not have
    opt.sync_every = 2
    state = TorchState(model, opt, epoch=0)
    state.sync()  # what hvd.elastic.run does after a reset
    synced = {"params": _params(model), "anchor": opt.anchor_state(), "steps": opt.steps,
              "outer": [t.clone() for t in opt.outer_optimizer.state_dict()["state"][0].values()]}
    state.commit()
    _train(model, opt, rank, range(10, 13))  # an averaging happens in there
    state.restore()  # a failure: back to the commit
    restored = {"params": _params(model), "anchor": opt.anchor_state(), "steps": opt.steps}
    _train(model, opt, rank, range(20, 21))  # and the ranks still average together (step 4)
    return {"start": start, "synced": synced, "restored": restored, "final": _params(model),
            "syncs": opt.syncs}


def test_broadcast_optimizer_state_and_elastic_state_give_every_rank_rank0s_anchor(ranks2):
    results = ranks2.run(broadcasts_from_rank0)
    root = results[0]
    for result in results:
        _assert_close(result["start"]["params"], root["start"]["params"], 0)
        _assert_close(result["start"]["anchor"], root["start"]["params"], 0)
        assert result["start"]["steps"] == 0  # the zero-gradient step that creates the state is not counted
        synced = result["synced"]
        _assert_close(synced["params"], root["synced"]["params"], 0)
        _assert_close(synced["anchor"], root["synced"]["params"], 0)  # rank 0's parameters, as the anchor
        assert synced["steps"] == root["synced"]["steps"] == 3
        _assert_close(synced["outer"], root["synced"]["outer"], 0)
        _assert_close(result["restored"]["params"], synced["params"], 0)
        _assert_close(result["restored"]["anchor"], synced["anchor"], 0)
        assert result["restored"]["steps"] == 3
    _assert_close(results[0]["final"], results[1]["final"], 0)
    assert results[0]["syncs"] == results[1]["syncs"]


def refused_on_every_rank() -> str:
    hvd.init()
    model = _model()
    try:
        hvd.LocalSGD(hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1)), sync_every=4)
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_a_distributed_optimizer_is_refused_on_every_rank(ranks2):
    for message in ranks2.run(refused_on_every_rank):
        assert message.startswith("LocalSGD(optimizer=hvd.DistributedOptimizer(SGD)): a DistributedOptimizer "
                                  "averages the gradients over the ranks at every step, which defeats")
        assert "HINT: wrap the plain torch optimizer" in message


def scaled_steps() -> dict:
    hvd.init()
    rank = hvd.rank()
    model = _model()
    opt = hvd.LocalSGD(torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    for step in range(4):
        opt.zero_grad()
        loss = _loss(model, rank, step)
        if rank == 0 and step == 1:
            loss = loss * float("inf")  # only rank 0 skips this step
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return {"params": _params(model), "syncs": opt.syncs, "steps": opt.steps}


def test_ranks_stay_in_step_when_the_grad_scaler_skips_on_one(ranks2):
    results = ranks2.run(scaled_steps, timeout=60)
    assert [(r["steps"], r["syncs"]) for r in results] == [(4, 2)] * 2
    _assert_close(results[0]["params"], results[1]["params"], 0)
