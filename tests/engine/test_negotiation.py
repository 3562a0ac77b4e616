"""Agreement checks and the round vector layout (pure, no ranks)."""

from __future__ import annotations

import dataclasses

import torch

from ringtrain.engine import negotiation as neg
from ringtrain.engine.requests import MAX, OpType, RequestMeta


def _meta(op: OpType = OpType.ALLREDUCE, **kw) -> RequestMeta:
    base = RequestMeta(key="x", names=("x",), op=op, set_id=0, dtypes=("float32",), shapes=((2, 3),))
    return dataclasses.replace(base, **kw)


def test_agreeing_requests_pass():
    assert neg.check_agreement({0: _meta(), 1: _meta()}) is None
    # Allgather may differ in the first dimension only.
    assert (
        neg.check_agreement({0: _meta(OpType.ALLGATHER), 1: _meta(OpType.ALLGATHER, shapes=((5, 3),))})
        is None
    )


def test_each_disagreement_has_horovods_prefix():
    cases = [
        (
            _meta(dtypes=("int32",)),
            "Mismatched data types: One rank had type float32, but another rank had type int32.",
        ),
        (
            _meta(shapes=((2, 4),)),
            "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [2, 3], "
            "but another rank sent a tensor of shape [2, 4].",
        ),
        (_meta(reduce_op=MAX), "Mismatched reduction operation"),
        (_meta(prescale=2.0), "Mismatched prescale and/or postscale factors"),
        (_meta(device=0), "Mismatched ALLREDUCE CPU/GPU device selection"),
    ]
    for other, prefix in cases:
        message = neg.check_agreement({0: _meta(), 1: other})
        assert message is not None
        assert message.startswith(prefix), message
    root = neg.check_agreement({0: _meta(OpType.BROADCAST, root=0), 1: _meta(OpType.BROADCAST, root=1)})
    assert root == (
        "Mismatched BROADCAST root ranks: One rank specified root rank 0, but another rank "
        "specified root rank 1."
    )
    dims = neg.check_agreement({0: _meta(OpType.ALLGATHER), 1: _meta(OpType.ALLGATHER, shapes=((2, 4),))})
    assert dims.startswith(
        "Mismatched ALLGATHER tensor shapes: One rank sent a tensor with dimension 1 equal to 3"
    )
    scalar = neg.check_agreement(
        {0: _meta(OpType.REDUCESCATTER, shapes=((),)), 1: _meta(OpType.REDUCESCATTER, shapes=((),))}
    )
    assert scalar == "Process-set rank zero tried to REDUCESCATTER a rank-zero tensor."


def test_join_error_names_the_op():
    assert neg.join_error(OpType.ALLGATHER).startswith("Allgather is not supported with Join at this time.")


def test_round_vector_layout():
    vector = neg.build_vector(
        world_size=3, rank=1, num_slots=4, payload_len=17, flags=neg.FLAG_PENDING, slots=[0, 3]
    )
    assert vector.tolist() == [0, 0, 17, neg.FLAG_PENDING, 0, 0, 1, 0, 0, 1]
    assert vector.dtype == torch.float64
    assert neg.build_vector(2, 0, 1, 0, 0, [], eager_size=3).numel() == 8
    payload = {"m": [_meta()], "s": []}
    assert neg.decode_payload(neg.encode_payload(payload)) == payload
