"""Tensor fusion: consecutive compatible allreduces run as one collective on a flat buffer."""

from __future__ import annotations

import math

from ringtrain.engine.requests import OpType, Response, dtype_from_name


def response_bytes(response: Response) -> int:
    ref = response.reference
    return sum(math.prod(shape) * dtype_from_name(dt).itemsize for shape, dt in zip(ref.shapes, ref.dtypes))


def fusion_key(response: Response) -> tuple | None:
    """Allreduces fuse when these agree; None for responses that never fuse."""
    if response.error is not None or response.op != OpType.ALLREDUCE:
        return None
    ref = response.reference
    if len(set(ref.dtypes)) != 1:
        return None
    return (
        ref.set_id,
        ref.dtypes[0],
        ref.reduce_op,
        ref.prescale,
        ref.postscale,
        ref.device >= 0,
        ref.device,
    )


def plan_batches(responses: list[Response], threshold: int) -> list[list[Response]]:
    """Split the agreed order into runs: fused allreduce batches (up to ``threshold`` bytes) and singles.

    The order of execution is preserved, so every rank builds the same batches.
    """
    batches: list[list[Response]] = []
    current: list[Response] = []
    current_key: tuple | None = None
    current_bytes = 0
    for response in responses:
        key = fusion_key(response)
        size = response_bytes(response) if key is not None else 0
        if (
            key is not None
            and threshold > 0
            and current
            and key == current_key
            and current_bytes + size <= threshold
        ):
            current.append(response)
            current_bytes += size
            continue
        if current:
            batches.append(current)
        current, current_key, current_bytes = [response], key, size
    if current:
        batches.append(current)
    return batches
