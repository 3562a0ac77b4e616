"""What every built-in workload offers: datasets, a model, a loss, and training defaults."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ringtrain.workloads.dataset import SizedDataset
from ringtrain.workloads.sources import DataSource

TASKS = {"classification": "accuracy", "regression": "rmse"}
"""Each task and the metric it is judged by."""


@dataclass(frozen=True)
class Defaults:
    """Training settings that work well for a workload (the Trainer's defaults, overridable by flags)."""

    epochs: int
    """Passes over the training set."""
    batch_size: int
    """Items per step on each worker (the global batch is this times the number of workers)."""
    lr: float
    """Learning rate for one worker; the Trainer may scale it with the number of workers."""
    optimizer: str = "sgd"
    """``"sgd"`` or ``"adam"``."""
    momentum: float = 0.0
    """SGD momentum (ignored by Adam)."""
    weight_decay: float = 0.0
    """L2 penalty passed to the optimizer."""

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer={self.optimizer!r} is not known. HINT: use 'sgd' or 'adam'.")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError(f"epochs={self.epochs}, batch_size={self.batch_size}, lr={self.lr}: "
                             "all must be positive. HINT: fix the value that is not.")


DataPath = str | Path | None


class Workload(ABC):
    """A built-in training task. ``get_workload(name)`` returns a fresh instance.

    ``model()`` may use what ``datasets()`` learned about the data (e.g. the number of MovieLens
    users), so call ``datasets()`` first on the same instance.
    """

    name: str = ""
    """Registry name, e.g. ``"mnist"``."""
    task: str = "classification"
    """``"classification"`` (metric accuracy) or ``"regression"`` (metric rmse)."""
    defaults: Defaults
    """Training settings that work for this workload."""
    description: str = ""
    """One line for ``--help`` and logs."""
    architectures: Mapping[str, Callable[..., nn.Module]] = {}
    """Model constructors by name; the first is the default of ``model()``."""
    source: DataSource | None = None
    """Where the last ``datasets()`` call found its files (None before, and for generated data)."""

    @property
    def metric(self) -> str:
        """``"accuracy"`` for classification, ``"rmse"`` for regression."""
        return TASKS[self.task]

    @abstractmethod
    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[SizedDataset, SizedDataset]:
        """The (train, test) datasets; ``subset`` keeps at most that many items of each (seeded choice).
        Most are a :class:`~ringtrain.workloads.dataset.TensorPairDataset`; the synthetic one's are made
        item by item.

        Raises DataError when the files are missing or malformed.
        """

    def model(self, arch: str | None = None) -> nn.Module:
        """A freshly initialised model (``arch`` picks one of ``architectures``)."""
        if not self.architectures:
            raise NotImplementedError(f"{type(self).__name__} defines no architectures")
        name = arch or next(iter(self.architectures))
        if name not in self.architectures:
            raise ValueError(f"arch={name!r} is not a model of workload {self.name!r}. "
                             f"HINT: use one of {sorted(self.architectures)}.")
        return self._build(self.architectures[name])

    def _build(self, constructor: Callable[..., nn.Module]) -> nn.Module:
        """Call a constructor; workloads whose models need data sizes override this."""
        return constructor()

    def loss(self) -> nn.Module:
        """Cross-entropy for classification (on logits or log-probabilities alike), MSE for regression."""
        return nn.CrossEntropyLoss() if self.task == "classification" else nn.MSELoss()

    def __repr__(self) -> str:
        return f"<workload {self.name}: {self.task}, {self.description}>"
