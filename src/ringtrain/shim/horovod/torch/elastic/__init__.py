"""``horovod.torch.elastic``: ringtrain's elastic training (``run``, ``TorchState``, ``ElasticSampler``)."""

from __future__ import annotations

from ringtrain.elastic import (  # noqa: F401
    ElasticSampler,
    ObjectState,
    State,
    TorchState,
    get_handler_registry,
    run,
    set_handler_registry,
)
