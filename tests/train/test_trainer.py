"""The Trainer: step-exact resume, gradient accumulation, ddp and horovod agree, on real data and ranks."""

import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from ringtrain.train import Trainer, TrainerConfig
from ringtrain.workloads import TensorPairDataset, get_workload


class DropoutNet(nn.Module):
    """Small, with dropout, so that resuming must restore the RNG to reproduce a run."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _blobs(n: int, seed: int) -> TensorPairDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 8, generator=g) + y[:, None].float()
    return TensorPairDataset(x, y)


def _train(folder: Path | None, epochs: int = 2, **config) -> tuple[Trainer, list]:
    torch.manual_seed(0)
    model = DropoutNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss(), _blobs(150, 1), _blobs(60, 2),
                      TrainerConfig(epochs=epochs, batch_size=16, progress=False, threads=1,
                                    snapshot_dir=str(folder) if folder else None, **config))
    history = trainer.train()
    trainer.close()
    return trainer, history


def test_resume_mid_epoch_reproduces_the_uninterrupted_run(tmp_path):
    whole, history = _train(tmp_path / "a", save_every_steps=3, save_every=1, keep_last=100)
    assert [r.epoch for r in history] == [1, 2]
    # pretend the run died after step 6 (mid first epoch: 10 steps per epoch): only that snapshot exists
    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "snapshot-000000006.pt", tmp_path / "b")
    resumed, rest = _train(tmp_path / "b", save_every_steps=3, save_every=1)
    assert resumed.resumed_from.name == "snapshot-000000006.pt"
    assert [r.epoch for r in rest] == [1, 2]  # the first epoch is finished, not restarted
    assert resumed.step == whole.step == 20
    for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    assert rest[-1].accuracy == history[-1].accuracy
    # the resumed epoch's training loss counts the batches done before the interruption too
    assert rest[0].train_loss == pytest.approx(history[0].train_loss, rel=1e-9)


def test_finished_run_resumes_to_nothing_and_more_epochs_continue(tmp_path):
    _train(tmp_path, epochs=1, save_every=1)
    again, history = _train(tmp_path, epochs=1, save_every=1)
    assert history == []
    assert again.epoch == 1
    more, history = _train(tmp_path, epochs=2, save_every=1)
    assert [r.epoch for r in history] == [2]
    assert more.step == 20


def test_no_resume_starts_afresh(tmp_path):
    _train(tmp_path, epochs=1, save_every=1)
    fresh, history = _train(tmp_path, epochs=1, save_every=1, resume=False)
    assert fresh.resumed_from is None
    assert len(history) == 1


def test_snapshot_of_another_model_stops_the_trainer(tmp_path):
    from ringtrain.train import SnapshotError

    _train(tmp_path, epochs=1, save_every=1)
    model = nn.Linear(8, 3)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(),
                      _blobs(20, 1), config=TrainerConfig(snapshot_dir=str(tmp_path), progress=False))
    try:
        with pytest.raises(SnapshotError, match="different model"):
            trainer.train()
    finally:
        trainer.close()


def test_accumulation_counts_steps_and_logs_csv(tmp_path):
    trainer, history = _train(None, epochs=1, batches_per_allreduce=3, log_dir=str(tmp_path))
    assert trainer.step == 4  # 10 micro-batches: 3 + 3 + 3 + 1
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("epoch,")
    assert len(lines) == 2
    assert history[0].eval_items == 60


def test_regression_reports_rmse():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    data = TensorPairDataset(x, x.sum(1))
    model = nn.Linear(4, 1)
    squeeze = nn.Sequential(model, nn.Flatten(0))
    trainer = Trainer(squeeze, torch.optim.SGD(squeeze.parameters(), lr=0.1), nn.MSELoss(), data, data,
                      TrainerConfig(epochs=5, batch_size=8, task="regression", progress=False))
    history = trainer.train()
    trainer.close()
    assert history[-1].rmse == pytest.approx(history[-1].eval_loss ** 0.5, rel=1e-5)
    assert history[-1].rmse < history[0].rmse


def train_mnist_on_rank(strategy: str, subset: int) -> float:
    """One epoch of the mnist workload on a small subset; returns the test accuracy."""
    torch.set_num_threads(1)
    workload = get_workload("mnist")
    train, test = workload.datasets(subset=subset, seed=0)
    torch.manual_seed(0)
    model = workload.model()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    trainer = Trainer(model, optimizer, workload.loss(), train, test,
                      TrainerConfig(epochs=2, batch_size=32, strategy=strategy, progress=False, threads=1))
    try:
        return trainer.train()[-1].accuracy
    finally:
        trainer.close()


@pytest.mark.slow
def test_ddp_and_horovod_reach_the_same_accuracy(ranks2):
    ddp = ranks2.run(train_mnist_on_rank, "ddp", 1500, timeout=400)
    hvd = ranks2.run(train_mnist_on_rank, "horovod", 1500, timeout=400)
    assert ddp[0] == ddp[1]
    assert hvd[0] == hvd[1]
    assert ddp[0] > 0.7
    assert hvd[0] > 0.7
    print(f"ddp accuracy {ddp[0]:.4f}, horovod accuracy {hvd[0]:.4f}")
    assert abs(ddp[0] - hvd[0]) < 0.05, (ddp, hvd)
