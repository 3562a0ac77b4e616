"""Elastic state: save/restore/sync of plain attributes, models, optimizers and samplers; handler
registry; the collective host-update check."""

from __future__ import annotations

import pytest
import torch

import ringtrain as hvd
from ringtrain.elastic import ElasticSampler, ObjectState, TorchState
from ringtrain.elastic.state import (
    HostUpdateResult,
    StateHandler,
    get_handler_registry,
    set_handler_registry,
)
from ringtrain.exceptions import HostsUpdatedInterrupt


def _parts(rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, ElasticSampler]:
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    sampler = ElasticSampler(list(range(10)))
    sampler.record_batch(0, 1 + rank)
    return model, opt, sampler


def torch_state_cycle() -> dict:
    hvd.init()
    rank = hvd.rank()
    model, opt, sampler = _parts(rank)
    state = TorchState(model, opt, sampler=sampler, epoch=rank, history=[rank])
    state.sync()  # everyone takes rank 0's model, optimizer, sampler and saved attributes
    synced = {"weight": model.weight.detach().clone(), "lr": opt.param_groups[0]["lr"],
              "momentum": opt.state[model.weight]["momentum_buffer"].clone(), "sampler": sampler.state_dict(),
              "epoch": state.epoch, "history": state.history}
    state.epoch = 5
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    opt.param_groups[0]["lr"] = 42.0
    sampler.record_batch(1, 2)
    state.epoch = 6
    state.restore()
    restored = {"weight_back": torch.equal(model.weight.detach(), synced["weight"]),
                "lr": opt.param_groups[0]["lr"], "sampler": sampler.state_dict(), "epoch": state.epoch}
    # assigning a new model to a handled attribute hands it to the handler
    replacement = torch.nn.Linear(3, 2)
    state.model = replacement
    with torch.no_grad():
        replacement.weight.zero_()
    state.restore()
    return {"synced": synced, "restored": restored,
            "replaced": state.model is replacement and torch.equal(replacement.weight.detach(),
                                                                   torch.zeros(2, 3)) is False}


def test_torch_state_sync_commit_restore(ranks2):
    results = ranks2.run(torch_state_cycle)
    root, other = results[0]["synced"], results[1]["synced"]
    assert torch.equal(root["weight"], other["weight"])
    assert torch.equal(root["momentum"], other["momentum"])
    assert other["lr"] == pytest.approx(0.1)
    assert other["sampler"] == {"epoch": 0, "processed_num": 2}
    assert other["epoch"] == 0
    assert other["history"] == [0]
    for result in results:
        assert result["restored"] == {"weight_back": True, "lr": pytest.approx(0.1),
                                      "sampler": {"epoch": 0, "processed_num": 2}, "epoch": 5}
        assert result["replaced"]


def object_state_callbacks() -> dict:
    hvd.init()
    calls = []
    state = ObjectState(hvd.broadcast_object, hvd.rank, value=hvd.rank() + 10)
    state.register_reset_callbacks([lambda: calls.append("a"), lambda: calls.append("b")])
    state.sync()
    synced = state.value
    state.value = 99
    state.restore()
    state.on_reset()
    return {"synced": synced, "restored": state.value, "calls": calls}


def test_object_state(ranks2):
    assert ranks2.run(object_state_callbacks) == [{"synced": 10, "restored": 10, "calls": ["a", "b"]}] * 2


class Counter:
    def __init__(self, n: int) -> None:
        self.n = n


class CounterHandler(StateHandler):
    def __init__(self, value: Counter) -> None:
        super().__init__(value)
        self.saved = value.n

    def save(self) -> None:
        self.saved = self.value.n

    def restore(self) -> None:
        self.value.n = self.saved

    def sync(self) -> None:
        self.value.n = hvd.broadcast_object(self.value.n, name="counter")


def custom_handler() -> tuple[int, int]:
    hvd.init()
    registry = get_handler_registry()
    set_handler_registry([*registry, (Counter, CounterHandler)])
    try:
        counter = Counter(hvd.rank() + 1)
        state = TorchState(counter=counter)
        state.sync()
        synced = counter.n
        state.commit()
        counter.n = 50
        state.restore()
        return synced, counter.n
    finally:
        set_handler_registry(registry)


def test_handler_registry_is_extensible(ranks2):
    assert ranks2.run(custom_handler) == [(1, 1), (1, 1)]


def host_updates(result: int) -> list[str]:
    hvd.init()
    state = ObjectState(hvd.broadcast_object, hvd.rank, x=1)
    seen = []
    state.commit()  # nothing happened: no interrupt
    if hvd.rank() == 0:  # only rank 0's view counts
        state.on_hosts_updated(1234.0, HostUpdateResult(result))
    try:
        state.commit()
    except HostsUpdatedInterrupt as exc:
        seen.append(f"interrupt skip_sync={exc.skip_sync}")
    state.commit()  # the update was consumed
    return seen


@pytest.mark.parametrize(("result", "skip"), [(1, True), (2, False), (3, False)])
def test_check_host_updates_is_collective(ranks2, result, skip):
    assert ranks2.run(host_updates, result) == [[f"interrupt skip_sync={skip}"]] * 2
