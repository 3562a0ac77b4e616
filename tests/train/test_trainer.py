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


# --- resuming with other settings (docs/restarts.md, "Resuming with other settings") ---------------

def _trainer(folder: Path, make_optimizer=None, **config) -> Trainer:
    """A Trainer on the blobs, resuming from ``folder`` (not yet trained)."""
    torch.manual_seed(0)
    model = DropoutNet()
    optimizer = (make_optimizer or (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)))(model.parameters())
    settings = {"epochs": 2, "batch_size": 16, "progress": False, "threads": 1, **config}
    return Trainer(model, optimizer, nn.CrossEntropyLoss(), _blobs(150, 1), None,
                   TrainerConfig(snapshot_dir=str(folder), **settings))


def _first_run(folder: Path, make_optimizer=None, **config) -> None:
    trainer = _trainer(folder, make_optimizer, **config)
    trainer.train()
    trainer.close()


def test_a_resumed_run_applies_its_own_learning_rate_and_momentum_and_says_so(tmp_path):
    _first_run(tmp_path, epochs=1, save_every=1)
    trainer = _trainer(tmp_path, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5), save_every=1)
    try:
        assert trainer.resume() is not None
        group = trainer.optimizer.param_groups[0]
        assert (group["lr"], group["momentum"]) == (0.05, 0.5)  # not the snapshot's 0.1 and 0.9
        assert trainer.optimizer.state  # while the snapshot's momentum buffers are kept
        assert trainer.resume_notes == ["changed since the snapshot, applied: --epochs 1 -> 2, "
                                        "--lr 0.1 -> 0.05, --momentum 0.9 -> 0.5"]
        assert "lr 0.05" in trainer.describe()
    finally:
        trainer.close()


def test_a_new_learning_rate_rescales_the_warmup_where_it_stands(tmp_path):
    # scale_lr x2 (two micro-batches per step), a warm-up of 5 steps; the newest snapshot is of step 4
    _first_run(tmp_path, epochs=1, batches_per_allreduce=2, scale_lr=True, warmup_epochs=1.0,
               save_every_steps=2)
    trainer = _trainer(tmp_path, lambda p: torch.optim.SGD(p, lr=0.05), batches_per_allreduce=2,
                       scale_lr=True, warmup_epochs=2.0, save_every_steps=2)
    try:
        assert trainer.resume().name == "snapshot-000000004.pt"
        assert trainer.scheduler.base_lrs == [pytest.approx(0.1)]  # 0.05 x 2
        # the new ramp (10 steps from 1/2 to 1) at step 4: 0.5 + 0.5 * 4 / 10, not the old one's 0.9
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.7)
        assert "--warmup-epochs 1 -> 2" in trainer.resume_notes[0]
        assert "--lr 0.1 -> 0.05" in trainer.resume_notes[0]
    finally:
        trainer.close()


def test_a_snapshot_of_an_earlier_version_gets_the_new_learning_rate_too(tmp_path):
    from ringtrain.train.snapshots import SnapshotManager

    _first_run(tmp_path, epochs=1, save_every=1)
    manager = SnapshotManager(tmp_path)
    path, body, _ = manager.load_newest()
    del body["run"]  # what snapshots held before they recorded the run's settings
    manager.save(body, int(path.stem.split("-")[1]))
    trainer = _trainer(tmp_path, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), save_every=1)
    try:
        trainer.resume()
        assert trainer.optimizer.param_groups[0]["lr"] == 0.05
        assert "--lr 0.1 -> 0.05" in trainer.resume_notes[0]
    finally:
        trainer.close()


@pytest.mark.parametrize(("batch_size", "position", "steps"), [
    (24, 2, 3 + 5),    # 48 items done = 2 batches of 24; the 102 left are 5 batches
    (20, 0, 3 + 8),    # 48 is no whole number of 20s: the epoch restarts (8 batches of 20)
])
def test_another_batch_size_goes_on_from_the_same_item_where_batches_allow(tmp_path, batch_size, position,
                                                                         steps, caplog):
    _first_run(tmp_path, epochs=1, save_every_steps=3)  # step 3 of 10: 48 of this rank's 150 items done
    for later in ("snapshot-000000006.pt", "snapshot-000000009.pt"):
        (tmp_path / later).unlink()  # as if the run had been stopped after step 3
    trainer = _trainer(tmp_path, epochs=1, batch_size=batch_size)
    try:
        trainer.resume()
        assert (trainer.epoch, trainer.batch_in_epoch) == (0, position)
        assert f"--batch-size 16 -> {batch_size}" in trainer.resume_notes[0]
        assert ("restarts from its beginning" in caplog.text) == (position == 0)
        history = trainer.train()
        assert history[-1].steps == steps
    finally:
        trainer.close()


def test_another_seed_or_optimizer_is_refused_before_anything_is_loaded(tmp_path):
    from ringtrain.train import SnapshotError

    _first_run(tmp_path, epochs=1, save_every=1)
    for make, config, needle in [
        (None, {"seed": 4}, "--seed 4 (the snapshot's run: --seed 0"),
        (lambda p: torch.optim.Adam(p, lr=0.1), {}, "--optimizer adam (the snapshot holds the state of SGD"),
    ]:
        trainer = _trainer(tmp_path, make, **config)
        try:
            with pytest.raises(SnapshotError, match="HINT: resume with") as info:
                trainer.resume()
            assert needle in str(info.value)
            assert trainer.step == 0  # nothing was loaded
        finally:
            trainer.close()
