"""Built-in workloads: datasets (MNIST, Fashion-MNIST, CIFAR-10, MovieLens, synthetic), models, losses.

``get_workload("mnist").datasets()`` works offline: the package embeds a small real MNIST subset.
"""

from ringtrain.exceptions import DataError
from ringtrain.workloads.base import Defaults, Workload
from ringtrain.workloads.dataset import TensorPairDataset
from ringtrain.workloads.registry import WORKLOADS, get_workload

__all__ = ["DataError", "Defaults", "TensorPairDataset", "WORKLOADS", "Workload", "get_workload"]
