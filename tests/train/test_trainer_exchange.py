"""The Trainer's ways of exchanging gradients on slow links: PowerSGD (ringtrain's in the Horovod
strategy, torch's hook in DDP), Local SGD and DiLoCo, and ``--compression auto``; snapshots of each
resume step-exactly, on two live ranks, and at another number of ranks."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ringtrain.exchange import Method
from ringtrain.train import Trainer, TrainerConfig
from ringtrain.train.strategies import HorovodStrategy
from ringtrain.workloads import TensorPairDataset

#: 2 epochs of 10 steps a rank (320 items, batch 16, 2 ranks); PowerSGD compresses from step 10 on.
ITEMS, BATCH, EPOCHS = 320, 16, 2


class Net(nn.Module):
    """Large enough for PowerSGD at rank 2 to compress its matrices, with dropout (RNG state matters)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _blobs(n: int, seed: int) -> TensorPairDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + y[:, None].float()
    return TensorPairDataset(x, y)


def run_trainer(folder: str | None, settings: dict[str, Any], epochs: int = EPOCHS) -> dict[str, Any]:
    """Train ``Net`` as one rank of the job (or alone); returns what the tests compare."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    config = TrainerConfig(epochs=epochs, batch_size=BATCH, progress=False, threads=1, snapshot_dir=folder,
                           keep_last=100, **settings)
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss(), _blobs(ITEMS, 1), _blobs(64, 2), config)
    try:
        history = trainer.train()
        return {"rank": trainer.strategy.rank, "step": trainer.step,
                "params": [p.detach().clone() for p in trainer.model.parameters()],
                "accuracy": history[-1].accuracy if history else None,
                "method": trainer.strategy.method.label,
                "resumed_from": trainer.resumed_from.name if trainer.resumed_from else None,
                "notes": list(trainer.resume_notes)}
    finally:
        trainer.close()
        del trainer
        gc.collect()


def copy_snapshot(source: Path, target: Path, step: int) -> None:
    """Only the snapshot of ``step`` (its checksum file and parts with it): as if the run died after it."""
    target.mkdir(parents=True, exist_ok=True)
    for file in source.glob(f"snapshot-{step:09d}*"):
        shutil.copy(file, target)


#: settings, the step whose snapshot a second run resumes from (after PowerSGD's 10 plain steps; between
#: two of Local SGD's averagings)
RESUMED = {
    "horovod-powersgd": ({"strategy": "horovod", "compression": "powersgd:2", "save_every_steps": 3}, 15),
    "ddp-powersgd": ({"strategy": "ddp", "compression": "powersgd:2", "save_every_steps": 3}, 15),
    "horovod-localsgd": ({"strategy": "horovod", "sync_every": 4, "save_every_steps": 3}, 6),
    "ddp-diloco": ({"strategy": "ddp", "sync_every": 4, "outer_lr": 0.7, "outer_momentum": 0.9,
                    "save_every_steps": 3}, 6),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUMED))
def test_a_resumed_run_continues_exactly_as_the_uninterrupted_one(name, ranks2, tmp_path):
    settings, step = RESUMED[name]
    whole = ranks2.run(run_trainer, str(tmp_path / "a"), settings, timeout=300)
    assert [r["step"] for r in whole] == [2 * 10, 2 * 10]
    parts = sorted(p.name for p in (tmp_path / "a").glob(f"snapshot-{step:09d}.rank-*.pt"))
    assert parts == [f"snapshot-{step:09d}.rank-00000.pt", f"snapshot-{step:09d}.rank-00001.pt"]
    copy_snapshot(tmp_path / "a", tmp_path / "b", step)
    resumed = ranks2.run(run_trainer, str(tmp_path / "b"), settings, timeout=300)
    for before, after in zip(whole, resumed):
        assert after["resumed_from"] == f"snapshot-{step:09d}.pt"
        assert after["step"] == before["step"]
        for a, b in zip(before["params"], after["params"]):
            assert torch.equal(a, b), name
    # every rank ends with the same model (PowerSGD averages every step; Local SGD at the epoch's end)
    for a, b in zip(whole[0]["params"], whole[1]["params"]):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["horovod-powersgd", "horovod-localsgd"])
def test_a_snapshot_of_two_ranks_resumes_on_one(name, ranks2, tmp_path):
    settings, step = RESUMED[name]
    ranks2.run(run_trainer, str(tmp_path / "a"), settings, timeout=300)
    copy_snapshot(tmp_path / "a", tmp_path / "b", step)
    alone = run_trainer(str(tmp_path / "b"), {**settings, "strategy": "horovod"}, epochs=3)
    assert alone["resumed_from"] == f"snapshot-{step:09d}.pt"
    assert "ranks 2 -> 1" in " ".join(alone["notes"])
    # another world: the snapshot's epoch starts again from its beginning, 20 steps an epoch on one rank
    assert alone["step"] == step + (3 - step // 10) * 20
    assert all(torch.isfinite(p).all() for p in alone["params"])


def test_auto_chooses_once_on_the_measured_link_and_says_so():
    # a link of 100 Mbit/s, 1 ms, measured by a fake: a model of 4 MB of gradients is worth PowerSGD there
    strategy = HorovodStrategy(compression="auto")
    strategy.world_size = 4
    strategy.measure_link = lambda: (1e-3, 100e6 / 8)  # type: ignore[method-assign]
    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 10))
    said = strategy.decide(model)
    assert strategy.method == Method("powersgd", rank=4)
    assert said is not None
    assert said.startswith("--compression auto: powersgd:4 (4.24 MB of fp32 gradients take ")
    assert strategy.decide(model) is None  # decided: nothing more to say


def auto_on_rank() -> dict[str, Any]:
    return run_trainer(None, {"strategy": "horovod", "compression": "auto"}, epochs=1)


@pytest.mark.slow
def test_auto_on_two_ranks_over_loopback_keeps_fp32_on_every_rank(ranks2):
    results = ranks2.run(auto_on_rank, timeout=300)
    assert [r["method"] for r in results] == ["fp32", "fp32"]  # a 20 KB model on loopback: nothing pays
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)


def bf16_on_rank() -> dict[str, Any]:
    return run_trainer(None, {"strategy": "ddp", "compression": "bf16"}, epochs=1)


@pytest.mark.slow
def test_ddp_sends_bf16_through_torch_s_hook(ranks2):
    results = ranks2.run(bf16_on_rank, timeout=300)
    assert [r["method"] for r in results] == ["bf16", "bf16"]
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)


class TwoBuckets(nn.Module):
    """More than DDP's 1 MiB first bucket: DDP's buckets after its first iteration are two."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 640), nn.ReLU(), nn.Linear(640, 640), nn.ReLU(),
                                 nn.Linear(640, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def powersgd_two_buckets_on_rank() -> dict[str, Any]:
    torch.manual_seed(0)
    model = TwoBuckets()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    config = TrainerConfig(epochs=2, batch_size=8, strategy="ddp", compression="powersgd:4", progress=False,
                           threads=1)
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss(), _blobs(ITEMS, 1), None, config)
    try:
        trainer.train()
        return {"step": trainer.step, "params": [p.detach().clone() for p in trainer.model.parameters()]}
    finally:
        trainer.close()
        del trainer
        gc.collect()


@pytest.mark.slow
def test_ddp_powersgd_with_two_buckets_keeps_the_collectives_in_one_order(ranks2):
    # torch's hook issues each bucket's later allreduces from callbacks; two buckets in flight raced, and
    # gloo saw the ranks' P allreduces of different buckets meet ("Received data size doesn't match")
    results = ranks2.run(powersgd_two_buckets_on_rank, timeout=300)
    assert [r["step"] for r in results] == [40, 40]
    for a, b in zip(results[0]["params"], results[1]["params"]):
        assert torch.equal(a, b)
