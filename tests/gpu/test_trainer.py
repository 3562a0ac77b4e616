"""The Trainer on CPU and CUDA: device pinning by local rank, mixed precision (GradScaler on CUDA) with
both strategies, snapshots written on the device and resumed there, and resumed on a machine without a
GPU after a GPU run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from ringtrain import check
from tests.gpu.placements import Placement

STRATEGIES = ("ddp", "horovod")


def _pinned(kind: str, strategy_name: str) -> dict:
    from ringtrain.train.strategies import make_strategy

    strategy = make_strategy(strategy_name, device=kind)
    strategy.setup()
    try:
        cuda = torch.cuda.is_available() and kind == "cuda"
        return {"local_rank": strategy.local_rank, "device": str(strategy.device),
                "current": torch.cuda.current_device() if cuda else None,
                "count": torch.cuda.device_count() if cuda else 0,
                "check_device": str(check.pick_device("auto" if cuda else "cpu", strategy.local_rank)),
                "nccl_group": getattr(strategy, "group", None) is not None}
    finally:
        strategy.teardown()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_rank_is_pinned_to_the_gpu_of_its_local_rank(placement: Placement, strategy: str) -> None:
    results = placement.pool.run(_pinned, placement.kind, strategy)
    assert [r["local_rank"] for r in results] == list(range(placement.size))
    for r in results:
        if placement.kind == "cpu":
            assert (r["device"], r["check_device"], r["nccl_group"]) == ("cpu", "cpu", False)
            continue
        # cuda:local_rank % GPUs, set as the current device: with one GPU every rank is on cuda:0
        assert r["current"] == r["local_rank"] % r["count"]
        assert r["device"] == r["check_device"] == f"cuda:{r['current']}"
        if strategy == "ddp":
            # NCCL where every rank has a GPU of its own; gloo where two share one (NCCL refuses)
            assert r["nccl_group"] == (placement.size > 1 and not placement.shared_gpu)
    if placement.shared_gpu:
        assert {r["device"] for r in results} == {"cuda:0"}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _images(size: int, seed: int) -> TensorDataset:
    """``size`` 3x8x8 images in 4 classes: the class's fixed pattern plus noise."""
    gen = torch.Generator().manual_seed(seed)
    patterns = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(99))
    labels = torch.randint(4, (size,), generator=gen)
    return TensorDataset(patterns[labels] + 0.5 * torch.randn(size, 3, 8, 8, generator=gen), labels)


def _train(kind: str, strategy: str, snapshot_dir: str, epochs: int, amp: bool) -> dict:
    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.trainer import Trainer

    train, evaluation = _images(96, seed=0), _images(32, seed=1)
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    config = TrainerConfig(epochs=epochs, batch_size=8, strategy=strategy, amp=amp, device=kind,
                           batches_per_allreduce=2, save_every=1, snapshot_dir=snapshot_dir, progress=False,
                           threads=1)
    with Trainer(model, optimizer, nn.CrossEntropyLoss(), train, evaluation, config) as trainer:
        history = trainer.train()
        # parameters agree across ranks; BatchNorm's running statistics are each rank's own
        weights = dict(trainer.strategy.unwrap(trainer.train_model).named_parameters())
        return {"device": str(trainer.strategy.device), "scaler": trainer.scaler is not None,
                "scale": trainer.scaler.get_scale() if trainer.scaler is not None else None,
                "epochs": [r.epoch for r in history], "losses": [r.train_loss for r in history],
                "accuracy": [r.accuracy for r in history], "step": trainer.step,
                "resumed_from": str(trainer.resumed_from) if trainer.resumed_from else None,
                "weights": {k: v.detach().cpu() for k, v in weights.items()},
                "cuda_visible": torch.cuda.is_available()}


def _agree(results: list[dict]) -> None:
    for result in results[1:]:
        for key, value in results[0]["weights"].items():
            assert torch.equal(result["weights"][key], value), key


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mixed_precision_snapshots_and_resume(placement: Placement, strategy: str, tmp_path: Path,
                                              hidden_gpu_pool) -> None:
    folder = str(tmp_path / "snapshots")
    first = placement.pool.run(_train, placement.kind, strategy, folder, 1, True, timeout=300)
    on_cuda = placement.kind == "cuda"
    for r in first:
        assert r["device"].startswith(placement.kind)
        assert r["scaler"] is on_cuda  # GradScaler on CUDA; bf16 autocast on CPU needs none
        assert r["epochs"] == [1]
        assert r["resumed_from"] is None
        assert all(math.isfinite(loss) for loss in r["losses"])
    _agree(first)
    snapshots = sorted(Path(folder).glob("snapshot-*.pt"))
    assert len(snapshots) == 1
    body = torch.load(snapshots[0], map_location="cpu", weights_only=True)
    assert (body["scaler"] is not None) is on_cuda
    assert body["epoch"] == 1
    assert body["world_size"] == placement.size

    second = placement.pool.run(_train, placement.kind, strategy, folder, 2, True, timeout=300)
    for r in second:
        assert r["resumed_from"] == str(snapshots[0])
        assert r["epochs"] == [2]
        assert r["step"] == 2 * first[0]["step"]
        assert all(math.isfinite(loss) for loss in r["losses"])
    _agree(second)
    # the snapshot resumes where no GPU is visible (a GPU run's tensors load onto the CPU)
    third = hidden_gpu_pool(placement.size).run(_train, "cpu", strategy, folder, 3, False, timeout=300)
    latest = sorted(Path(folder).glob("snapshot-*.pt"))[-2]
    for r in third:
        assert r["cuda_visible"] is False
        assert r["device"] == "cpu"
        assert r["resumed_from"] == str(latest)
        assert r["epochs"] == [3]
        assert r["step"] == 3 * first[0]["step"]
    _agree(third)


#: The slow-link methods of the Trainer (docs/slow-links.md): PowerSGD at rank 2 (the convolution's 8 x 27
#: gradient is compressed; the 10 plain steps are over in the second epoch), Local SGD, DiLoCo, bf16.
EXCHANGES = {"powersgd": {"compression": "powersgd:2"}, "localsgd": {"sync_every": 2},
             "diloco": {"sync_every": 2, "outer_lr": 0.7, "outer_momentum": 0.9},
             "bf16": {"compression": "bf16"}}


def _exchange(kind: str, strategy: str, settings: dict, snapshot_dir: str, epochs: int) -> dict:
    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.trainer import Trainer

    train, evaluation = _images(96, seed=0), _images(32, seed=1)
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    config = TrainerConfig(epochs=epochs, batch_size=8, strategy=strategy, device=kind, save_every=1,
                           snapshot_dir=snapshot_dir, progress=False, threads=1, **settings)
    with Trainer(model, optimizer, nn.CrossEntropyLoss(), train, evaluation, config) as trainer:
        history = trainer.train()
        weights = dict(trainer.strategy.unwrap(trainer.train_model).named_parameters())
        return {"device": str(trainer.strategy.device), "step": trainer.step,
                "method": trainer.strategy.method.label,
                "losses": [r.train_loss for r in history],
                "resumed_from": str(trainer.resumed_from) if trainer.resumed_from else None,
                "weights": {k: v.detach().cpu() for k, v in weights.items()}}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("exchange", list(EXCHANGES))
def test_each_slow_link_method_trains_and_resumes_on_the_device(pair: Placement, strategy: str, exchange: str,
                                                                 tmp_path: Path) -> None:
    folder = str(tmp_path / "snapshots")
    settings = EXCHANGES[exchange]
    first = pair.pool.run(_exchange, pair.kind, strategy, settings, folder, 2, timeout=300)
    resumed = pair.pool.run(_exchange, pair.kind, strategy, settings, folder, 4, timeout=300)
    for r in first + resumed:
        assert r["device"].startswith(pair.kind)
        assert all(math.isfinite(loss) for loss in r["losses"])
    assert [r["step"] for r in resumed] == [24] * pair.size  # 6 steps an epoch, 4 epochs
    assert all(r["resumed_from"] and r["resumed_from"].endswith("snapshot-000000012.pt") for r in resumed)
    _agree(first)  # every method leaves the ranks with one model at an epoch's end
    _agree(resumed)
