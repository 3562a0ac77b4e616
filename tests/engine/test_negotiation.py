"""Agreement checks and the round vector layout (pure, no ranks)."""

from __future__ import annotations

import dataclasses
import json

import pytest
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


# ------------------------------------------------------------------------------ the wire format
def test_every_field_survives_the_wire_exactly():
    full = _meta(OpType.ALLTOALL, names=("a", "b"), dtypes=("float16", "int64"), shapes=((), (4, 0, 2)),
                 reduce_op=MAX, root=3, prescale=0.5, postscale=float("inf"), device=1, splits=(1, 0, 2),
                 set_id=7, key="a|b")
    control = RequestMeta(key="process_set.add", names=("process_set.add",), op=OpType.PROCESS_SET_ADD,
                          set_id=0, dtypes=(), shapes=(), payload=(0, 2))
    message = {"m": [full, control], "s": [("allreduce.w", 0), ("x", 3)]}
    decoded = neg.decode_payload(neg.encode_payload(message))
    assert decoded == message
    # Same types as the original (the response cache compares metadata with ==).
    assert all(type(d) is int for shape in decoded["m"][0].shapes for d in shape)
    assert type(decoded["m"][0].op) is OpType
    assert neg.decode_payload(neg.encode_payload({"m": [], "s": []})) == {"m": [], "s": []}


class _Detonator:
    """Unpickling this would create ``path``: the injected command of the issue's attack."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        import os

        return (os.mkdir, (self.path,))


def test_a_pickle_is_refused_and_never_run(tmp_path):
    import pickle

    target = tmp_path / "pwned"
    bomb = pickle.dumps({"m": [_Detonator(str(target))], "s": []}, protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(neg.PayloadError, match=r"starts with b'\\x80'.*HINT: run the same ringtrain version"):
        neg.decode_payload(bomb)
    with pytest.raises(neg.PayloadError):
        neg.decode_payload(neg.PAYLOAD_FORMAT + bomb)
    assert not target.exists()


@pytest.mark.parametrize("message", [
    b"",
    b"\x01",
    b"\x01not json",
    b'\x01{"m": [], "s": []}',
    b"\x01[[], [], []]",
    b'\x01[[["x", ["x"], 0, 0, ["float32"], [[2]], 1, -1, 1.0, 1.0, -1, null]], []]',  # a field short
    b'\x01[[["x", ["x"], 0, 0, ["os.system"], [[2]], 1, -1, 1.0, 1.0, -1, null, null]], []]',
    b'\x01[[["x", ["x"], 0, 0, ["float32"], [[true]], 1, -1, 1.0, 1.0, -1, null, null]], []]',
    b'\x01[[["x", ["x"], 99, 0, ["float32"], [[2]], 1, -1, 1.0, 1.0, -1, null, null]], []]',
    b'\x01[[["x", "x", 0, 0, ["float32"], [[2]], 1, -1, 1.0, 1.0, -1, null, null]], []]',
    b'\x01[[["x", ["x"], 0, 0, ["float32"], [[2]], 1, -1, "1.0", 1.0, -1, null, null]], []]',
    b'\x01[[], [["name", "0"]]]',
])
def test_malformed_messages_are_refused(message):
    with pytest.raises(neg.PayloadError, match="HINT"):
        neg.decode_payload(message)


def test_the_wire_format_holds_no_pickle():
    encoded = neg.encode_payload({"m": [_meta()], "s": [("x", 0)]})
    assert encoded.startswith(neg.PAYLOAD_FORMAT)
    json.loads(encoded[1:])  # plain JSON after the format byte
