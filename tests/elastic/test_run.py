"""hvd.elastic.run: a plain run, a restore after HorovodInternalError, a reset on HostsUpdatedInterrupt."""

from __future__ import annotations

import torch

import ringtrain as hvd
from ringtrain.exceptions import HorovodInternalError, HostsUpdatedInterrupt


def _setup() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(hvd.rank())  # ranks start different: the first sync must align them
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    return model, opt


def train_without_failures() -> dict:
    hvd.init()
    model, opt = _setup()
    data = [torch.randn(4) for _ in range(12)]
    sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> int:
        steps = 0
        for state.epoch in range(state.epoch, 2):  # noqa: B020 - the Horovod idiom: progress lives in state
            sampler.set_epoch(state.epoch)
            for state.batch, idx in enumerate(sampler):
                opt.zero_grad()
                (model(data[idx]) ** 2).sum().backward()
                opt.step()
                sampler.record_batch(state.batch, 1)
                state.commit()
                steps += 1
        return steps

    steps = train(state)
    return {"steps": steps, "weight": model.weight.detach().clone(), "epoch": state.epoch}


def test_elastic_run_without_failures(ranks2):
    results = ranks2.run(train_without_failures)
    assert [r["steps"] for r in results] == [12, 12]
    assert torch.equal(results[0]["weight"], results[1]["weight"])


def restore_after_error(kind: str) -> dict:
    hvd.init()
    model, opt = _setup()
    state = hvd.elastic.TorchState(model, opt, value=0)
    events = []
    state.register_reset_callbacks([lambda: events.append(f"reset size={hvd.size()}")])
    calls = {"n": 0}

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> tuple[int, torch.Tensor]:
        calls["n"] += 1
        events.append(f"call {calls['n']} value={state.value}")
        if calls["n"] == 1:
            state.value = 1
            state.commit()
            state.value = 2  # not committed: lost on restore
            with torch.no_grad():
                model.weight.add_(10.0)
            if kind == "internal":
                raise HorovodInternalError("simulated peer failure")
            raise HostsUpdatedInterrupt(skip_sync=True)
        return state.value, model.weight.detach().clone()

    value, weight = train(state)
    return {"value": value, "weight": weight, "events": events, "initialized": hvd.is_initialized()}


def test_restore_after_internal_error(ranks2):
    results = ranks2.run(restore_after_error, "internal", timeout=180)
    for result in results:
        assert result["events"] == ["call 1 value=0", "reset size=2", "call 2 value=1"]
        assert result["value"] == 1
        assert result["initialized"]
    # the committed weights (rank 0's, synced) came back on both ranks, without the +10
    assert torch.equal(results[0]["weight"], results[1]["weight"])
    assert results[0]["weight"].abs().max() < 5


def test_hosts_updated_resets_without_restore(ranks2):
    results = ranks2.run(restore_after_error, "hosts", timeout=180)
    for result in results:
        assert result["events"] == ["call 1 value=0", "reset size=2", "call 2 value=2"]
        assert result["value"] == 2
        assert result["weight"].abs().min() > 5  # the uncommitted +10 is still there
