"""The Trainer with sharded optimizer state (``shard_optimizer=True``): the same training as unsharded,
snapshots whose shards resume at another number of ranks as an unsharded snapshot does, and torch's
ZeroRedundancyOptimizer in the DDP strategy."""

from __future__ import annotations

import gc
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ringtrain.train import Trainer, TrainerConfig
from ringtrain.workloads import TensorPairDataset

pytestmark = pytest.mark.slow  # every test trains on live ranks

ITEMS = 384  # 12 steps an epoch on 2 ranks (batch 16), 6 on 4, 24 on 1


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _blobs(n: int, seed: int) -> TensorPairDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorPairDataset(torch.randn(n, 8, generator=g) + y[:, None].float(), y)


def train_on_rank(folder: str | None, settings: dict[str, Any], epochs: int = 2) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    config = TrainerConfig(epochs=epochs, batch_size=16, progress=False, threads=1, snapshot_dir=folder,
                           keep_last=100, **settings)
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss(), _blobs(ITEMS, 1), None, config)
    try:
        trainer.train()
        return {"step": trainer.step, "describe": trainer.describe(),
                "resumed_from": trainer.resumed_from.name if trainer.resumed_from else None,
                "params": [p.detach().clone() for p in trainer.model.parameters()]}
    finally:
        trainer.close()
        del trainer
        gc.collect()


def _close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def _snapshot(source: Path, target: Path, step: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.glob(f"snapshot-{step:09d}*"):
        shutil.copy(file, target)


SHARDED = {"strategy": "horovod", "shard_optimizer": True, "save_every_steps": 6}
UNSHARDED = {"strategy": "horovod", "save_every_steps": 6}


def test_sharded_training_takes_the_unsharded_steps_and_resumes_exactly(ranks2, tmp_path):
    sharded = ranks2.run(train_on_rank, str(tmp_path / "sharded"), SHARDED, timeout=300)
    unsharded = ranks2.run(train_on_rank, str(tmp_path / "unsharded"), UNSHARDED, timeout=300)
    assert "; optimizer state sharded over 2 ranks: rank 0 owns " in sharded[0]["describe"]
    for s, u in zip(sharded, unsharded):
        assert s["step"] == u["step"] == 24
        _close(s["params"], u["params"])
    # each rank's shard is a part of the snapshot
    assert sorted(p.name for p in (tmp_path / "sharded").glob("snapshot-000000018.rank-*.pt")) == [
        "snapshot-000000018.rank-00000.pt", "snapshot-000000018.rank-00001.pt"]
    _snapshot(tmp_path / "sharded", tmp_path / "again", 18)
    resumed = ranks2.run(train_on_rank, str(tmp_path / "again"), SHARDED, timeout=300)
    for before, after in zip(sharded, resumed):
        assert after["resumed_from"] == "snapshot-000000018.pt"
        for a, b in zip(before["params"], after["params"]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("ranks", [1, 4])
def test_a_sharded_snapshot_of_two_ranks_resumes_at_another_size_as_an_unsharded_one(ranks, ranks2, ranks4,
                                                                                    tmp_path):
    ranks2.run(train_on_rank, str(tmp_path / "sharded"), SHARDED, timeout=300)
    ranks2.run(train_on_rank, str(tmp_path / "unsharded"), UNSHARDED, timeout=300)
    _snapshot(tmp_path / "sharded", tmp_path / "from-sharded", 18)  # the middle of epoch 2
    _snapshot(tmp_path / "unsharded", tmp_path / "from-unsharded", 18)
    if ranks == 1:
        a = [train_on_rank(str(tmp_path / "from-sharded"), SHARDED, epochs=3)]
        b = [train_on_rank(str(tmp_path / "from-unsharded"), UNSHARDED, epochs=3)]
    else:
        a = ranks4.run(train_on_rank, str(tmp_path / "from-sharded"), SHARDED, 3, timeout=400)
        b = ranks4.run(train_on_rank, str(tmp_path / "from-unsharded"), UNSHARDED, 3, timeout=400)
    # at another size the position in epoch 2 does not carry over: epochs 2 and 3 are trained whole
    steps_per_epoch = ITEMS // 16 // ranks
    for x, y in zip(a, b):
        assert x["resumed_from"] == y["resumed_from"] == "snapshot-000000018.pt"
        assert x["step"] == y["step"] == 18 + 2 * steps_per_epoch
        _close(x["params"], y["params"])


def test_an_unsharded_run_resumes_a_sharded_snapshot_and_the_ddp_strategy_too(ranks2, tmp_path):
    ranks2.run(train_on_rank, str(tmp_path / "sharded"), SHARDED, timeout=300)
    ranks2.run(train_on_rank, str(tmp_path / "unsharded"), UNSHARDED, timeout=300)
    for name in ("horovod", "ddp"):
        for source in ("sharded", "unsharded"):
            folder = tmp_path / f"{name}-{source}"
            _snapshot(tmp_path / source, folder, 18)
        a = ranks2.run(train_on_rank, str(tmp_path / f"{name}-sharded"), {"strategy": name}, 3, timeout=300)
        b = ranks2.run(train_on_rank, str(tmp_path / f"{name}-unsharded"), {"strategy": name}, 3, timeout=300)
        for x, y in zip(a, b):
            assert x["resumed_from"] == "snapshot-000000018.pt"
            _close(x["params"], y["params"])


ZERO = {"strategy": "ddp", "shard_optimizer": True, "save_every_steps": 6}


def test_ddp_shards_with_torch_s_zero_and_resumes_its_consolidated_snapshot(ranks2, tmp_path):
    zero = ranks2.run(train_on_rank, str(tmp_path / "zero"), ZERO, timeout=300)
    plain = ranks2.run(train_on_rank, None, {"strategy": "ddp"}, timeout=300)
    assert "ZeroRedundancyOptimizer" in zero[0]["describe"]
    for z, p in zip(zero, plain):
        _close(z["params"], p["params"])
    assert not list((tmp_path / "zero").glob("*.rank-*.pt"))  # consolidated on rank 0: no parts
    _snapshot(tmp_path / "zero", tmp_path / "again", 18)
    resumed = ranks2.run(train_on_rank, str(tmp_path / "again"), ZERO, timeout=300)
    for before, after in zip(zero, resumed):
        assert after["resumed_from"] == "snapshot-000000018.pt"
        for a, b in zip(before["params"], after["params"]):
            assert torch.equal(a, b)
