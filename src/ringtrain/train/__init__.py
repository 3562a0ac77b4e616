"""The Trainer: data-parallel training with DDP or Horovod, atomic snapshots, correct metrics.

``Trainer(model, optimizer, loss_fn, train_data, eval_data, TrainerConfig(...)).train()``.
"""

from ringtrain.train.config import TrainerConfig
from ringtrain.train.metrics import EpochResult
from ringtrain.train.snapshots import SnapshotError, SnapshotManager
from ringtrain.train.trainer import Trainer

__all__ = ["EpochResult", "SnapshotError", "SnapshotManager", "Trainer", "TrainerConfig"]
