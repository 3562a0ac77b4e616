"""The eager path's pieces: which cached allreduces get room in the round vector, and their numerics."""

from __future__ import annotations

import torch

from ringtrain.engine import eager
from ringtrain.engine.cache import ResponseCache
from ringtrain.engine.requests import AVERAGE, MAX, SUM, OpType, Request, RequestMeta, Response


def _meta(key: str, numel: int = 4, op: int = SUM, dtype: str = "float32", device: int = -1,
          kind: OpType = OpType.ALLREDUCE, prescale: float = 1.0, postscale: float = 1.0) -> RequestMeta:
    return RequestMeta(key=key, names=(key,), op=kind, set_id=0, dtypes=(dtype,), shapes=((numel,),),
                       reduce_op=op, device=device, prescale=prescale, postscale=postscale)


def _cache(*metas: RequestMeta) -> ResponseCache:
    cache = ResponseCache(16)
    for meta in metas:
        cache.insert(Response(meta.key, 0, meta.op, {0: meta}))
    return cache


def test_only_small_cpu_sum_or_average_allreduces_get_room():
    cache = _cache(
        _meta("sum"),                                   # slot 0: yes
        _meta("average", numel=2, op=AVERAGE),          # slot 1: yes
        _meta("max", op=MAX),                           # not Sum/Average
        _meta("cuda", device=0),                        # not on the CPU
        _meta("big", numel=eager.MAX_ELEMENTS + 1),     # too large for the vector
        _meta("int64", dtype="int64"),                  # not exact in a float64 sum
        _meta("gather", kind=OpType.ALLGATHER),         # not an allreduce
        _meta("empty", numel=0),
    )
    places, total = eager.layout(cache, budget=2048)
    assert places == {0: (0, 4), 1: (4, 2)}
    assert total == 6


def test_the_budget_bounds_the_total():
    cache = _cache(_meta("a", numel=300), _meta("b", numel=300), _meta("c", numel=100))
    places, total = eager.layout(cache, budget=450)
    assert places == {0: (0, 300), 2: (300, 100)}
    assert total == 400
    assert eager.layout(cache, budget=0) == ({}, 0)


def test_write_prescales_and_integers_truncate_before_the_sum():
    vector = torch.zeros(8, dtype=torch.float64)
    floats = Request(meta=_meta("f", numel=2, prescale=0.5), handle=0, inputs=[torch.tensor([1.0, 3.0])],
                     outputs=[None])
    ints = Request(meta=_meta("i", numel=2, dtype="int32", prescale=0.5), handle=1,
                   inputs=[torch.tensor([3, -3], dtype=torch.int32)], outputs=[None])
    eager.write(floats, vector, 1)
    eager.write(ints, vector, 4)
    assert vector.tolist() == [0.0, 0.5, 1.5, 0.0, 1.0, -1.0, 0.0, 0.0]


def test_finish_averages_post_scales_and_keeps_dtypes():
    meta = _meta("avg", numel=3, op=AVERAGE, dtype="int32", postscale=3.0)
    request = Request(meta=meta, handle=0, inputs=[torch.zeros(3, dtype=torch.int32)], outputs=[None])
    summed = torch.tensor([2.0, 5.0, -5.0], dtype=torch.float64)
    eager.finish(Response("avg", 0, OpType.ALLREDUCE, {0: meta}), request, summed, set_size=2)
    out = request.outputs[0]
    assert out.dtype == torch.int32
    assert out.tolist() == [3, 7, -7]  # 3/2 * summed, truncated toward zero
