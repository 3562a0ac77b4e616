"""Fusion planning: which consecutive responses share one collective (pure, no ranks)."""

from __future__ import annotations

from ringtrain.engine.fusion import plan_batches
from ringtrain.engine.requests import SUM, OpType, RequestMeta, Response


def _resp(
    key: str,
    op: OpType = OpType.ALLREDUCE,
    dtype: str = "float32",
    numel: int = 4,
    reduce_op: int = SUM,
    error: str | None = None,
) -> Response:
    meta = RequestMeta(
        key=key, names=(key,), op=op, set_id=0, dtypes=(dtype,), shapes=((numel,),), reduce_op=reduce_op
    )
    return Response(key, 0, op, {0: meta}, error)


def _keys(batches: list[list[Response]]) -> list[list[str]]:
    return [[r.key for r in batch] for batch in batches]


def test_consecutive_compatible_allreduces_fuse_in_order():
    responses = [
        _resp("a"),
        _resp("b"),
        _resp("c", dtype="float64"),
        _resp("d", dtype="float64"),
        _resp("e", op=OpType.ALLGATHER),
        _resp("f"),
        _resp("g", reduce_op=0),
    ]
    assert _keys(plan_batches(responses, 1 << 20)) == [["a", "b"], ["c", "d"], ["e"], ["f"], ["g"]]


def test_threshold_limits_batch_bytes_and_zero_disables_fusion():
    responses = [_resp(k, numel=4) for k in "abcde"]  # 16 bytes each
    assert _keys(plan_batches(responses, 32)) == [["a", "b"], ["c", "d"], ["e"]]
    assert _keys(plan_batches(responses, 0)) == [[k] for k in "abcde"]


def test_error_responses_never_fuse():
    responses = [_resp("a"), _resp("b", error="Mismatched data types"), _resp("c")]
    assert _keys(plan_batches(responses, 1 << 20)) == [["a"], ["b"], ["c"]]
