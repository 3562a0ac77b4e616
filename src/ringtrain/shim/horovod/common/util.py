"""``horovod.common.util``: the small helpers Horovod scripts and tests import."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any


def is_iterable(x: Any) -> bool:
    """True if ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


def split_list(items: list[Any], parts: int) -> list[list[Any]]:
    """Split ``items`` into ``parts`` contiguous chunks whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def num_rank_is_power_2(num_rank: int) -> bool:
    """True for 1, 2, 4, 8, ..."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the framework sees a GPU (only ``torch`` is known here)."""
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def env(**kwargs: Any) -> Iterator[None]:
    """Set environment variables for the duration of a ``with`` block."""
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable[[Any, Any], Any]:
    """Horovod's mapping of the legacy ``average=`` flag onto ``op=``."""

    def resolve(op: Any, average: Any) -> Any:
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one of them.")
            return op
        if average is not None:
            warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                          DeprecationWarning, stacklevel=3)
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average

    return resolve
