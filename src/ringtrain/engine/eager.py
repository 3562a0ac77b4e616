"""The eager path: small cached Sum/Average CPU allreduces travel inside the round vector itself.

The round vector is summed over all ranks anyway (see :mod:`ringtrain.engine.negotiation`). A cached
allreduce small enough gets a fixed place at its end, the same on every rank because the cache is
replicated: each rank writes its (pre-scaled) input there, and when the slot turns out ready, the
round's sum already is the result. Such a call costs one exchange instead of a round and then a
collective, which is what a training step's many tiny allreduces (metrics, counters) need.
"""

from __future__ import annotations

import math

import torch

from ringtrain.engine.cache import ResponseCache
from ringtrain.engine.executor import scale_
from ringtrain.engine.requests import AVERAGE, SUM, OpType, Request, Response

#: At most this many elements per request; RINGTRAIN_EAGER_ELEMENTS bounds the total (0: off).
MAX_ELEMENTS = 512
#: Dtypes whose values a float64 sum carries exactly enough (as the data path would reduce them).
DTYPES = {"float16", "bfloat16", "float32", "float64", "int32", "int16", "int8", "uint8"}


def layout(cache: ResponseCache, budget: int) -> tuple[dict[int, tuple[int, int]], int]:
    """Offset and length, by cache slot, of the eager allreduces in the vector's eager part; its size.

    A function of the replicated cache only, so every rank computes the same layout.
    """
    places: dict[int, tuple[int, int]] = {}
    total = 0
    for slot in range(cache.num_slots):
        response = cache.response(slot)
        if response is None or response.op != OpType.ALLREDUCE:
            continue
        ref = response.reference
        if ref.device >= 0 or ref.reduce_op not in (AVERAGE, SUM) or len(set(ref.dtypes)) != 1:
            continue
        if ref.dtypes[0] not in DTYPES:
            continue
        numel = sum(math.prod(shape) for shape in ref.shapes)
        if numel == 0 or numel > MAX_ELEMENTS or total + numel > budget:
            continue
        places[slot] = (total, numel)
        total += numel
    return places, total


def write(request: Request, vector: torch.Tensor, start: int) -> None:
    """Put this rank's (pre-scaled) inputs into the round vector at ``start``."""
    prescale = request.meta.prescale
    for tensor in request.inputs:
        numel = tensor.numel()
        target = vector[start : start + numel]
        if prescale != 1.0 and not tensor.dtype.is_floating_point:
            # Integers are scaled (and truncated) before the reduction, as on the data path.
            scaled = tensor.reshape(-1).clone()
            scale_(scaled, prescale)
            target.copy_(scaled)
        else:
            target.copy_(tensor.reshape(-1))
            if prescale != 1.0:
                target.mul_(prescale)
        start += numel


def finish(response: Response, request: Request, summed: torch.Tensor, set_size: int) -> None:
    """Write the round's sum, post-scaled (and averaged), into the request's outputs."""
    ref = response.reference
    post = ref.postscale / set_size if ref.reduce_op == AVERAGE else ref.postscale
    if post != 1.0:
        summed = summed * post
    offset = 0
    for i, tensor in enumerate(request.inputs):
        numel = tensor.numel()
        values = summed[offset : offset + numel]
        if not tensor.dtype.is_floating_point:
            values = values.trunc()
        out = request.outputs[i]
        if out is None:
            out = request.outputs[i] = torch.empty_like(tensor)
        out.reshape(-1).copy_(values)
        offset += numel
