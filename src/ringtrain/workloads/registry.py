"""The names of the built-in workloads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from ringtrain.exceptions import UnknownWorkloadError
from ringtrain.workloads.base import Workload
from ringtrain.workloads.cifar import Cifar10Workload
from ringtrain.workloads.mnist import FashionMnistWorkload, MnistWorkload
from ringtrain.workloads.movielens import MovieLensWorkload
from ringtrain.workloads.synthetic import SyntheticImagesWorkload, SyntheticRatingsWorkload

WORKLOADS: Mapping[str, Callable[..., Workload]] = MappingProxyType({
    "mnist": MnistWorkload,
    "fashion-mnist": FashionMnistWorkload,
    "cifar10": Cifar10Workload,
    "movielens": MovieLensWorkload,
    "synthetic": SyntheticImagesWorkload,
    "synthetic-ratings": SyntheticRatingsWorkload,
})
"""Workload name -> class; ``get_workload`` is the usual way in."""


def get_workload(name: str, **options: object) -> Workload:
    """A fresh workload by name; ``options`` go to its constructor (e.g. the synthetic shapes).

    Raises UnknownWorkloadError (a KeyError and ValueError) listing the valid names.
    """
    try:
        factory = WORKLOADS[name]
    except KeyError:
        valid = ", ".join(sorted(WORKLOADS))
        raise UnknownWorkloadError(f"unknown workload {name!r}. HINT: use one of {valid}.") from None
    return factory(**options)
