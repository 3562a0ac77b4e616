"""``import horovod.torch as hvd``, served by ringtrain: every public name of ``ringtrain``'s Horovod
API (the objects themselves, not copies), ``elastic`` and ``mpi_ops`` as submodules."""

from __future__ import annotations

from horovod.torch import elastic, mpi_ops  # noqa: F401 - submodules scripts reach as attributes

import ringtrain as _ringtrain

__all__ = sorted(name for name in _ringtrain.__all__ if name not in _ringtrain.NOT_HOROVOD)

for _name in __all__:
    if _name != "elastic":
        globals()[_name] = getattr(_ringtrain, _name)
del _name
