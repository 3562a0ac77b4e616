"""Adasum: Horovod's adaptive summation of gradients (``op=hvd.Adasum``).

Two vectors ``a`` and ``b`` (one tensor of two ranks) combine as::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

which is ``a + b`` for orthogonal vectors and their average for parallel ones. A coefficient stays 1
where its vector's squared norm is below ``sqrt(DBL_MIN)`` (a zero vector passes the other through).
Dot products and norms are taken in float64, per tensor: a fused buffer holds several tensors, and each
gets its own coefficients, as in Horovod.

Over ranks the rule is applied as a binary tree, pairing neighbours first: with four members,
``adasum(adasum(g0, g1), adasum(g2, g3))``. Horovod accepts only power-of-two sizes; here a size that
is not one is read as padded with zero vectors up to the next power of two, which the rule passes
through unchanged, so three members give ``adasum(adasum(g0, g1), g2)``. Joined ranks contribute zero
vectors the same way.

How it runs: at level ``L`` (1, 2, 4, ...) the members form blocks of ``2L``; every member of a block's
lower half holds the lower half's result, every member of the upper half the upper half's. Member ``j``
of the upper half pairs with member ``j`` of the lower half. The pair splits the vector: each sends the
other the half it does not own, both compute their half's partial dot products and swap them (so the
coefficients are the same sum on both), each combines its own half and sends it back. Every element
is computed on one rank and copied to the other, so all members end with bit-identical results. Lower
members without a partner (a short upper half) receive the result from an upper member.

CUDA tensors follow Horovod's NCCL build: the ranks of each host average their tensors first, the
host roots run Adasum among themselves on host copies, and each root broadcasts to its host (one host:
just the average). ``HOROVOD_HIERARCHICAL_ALLREDUCE=1`` does the same for CPU tensors when the set
spans several hosts. See :mod:`ringtrain.engine.hierarchical`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from ringtrain.engine.peers import Peers

#: Below this squared norm a coefficient stays 1 (Horovod: sqrt(DBL_MIN)).
NORM_FLOOR = sys.float_info.min**0.5
#: Dtypes Adasum accepts (Horovod: float16, float32, float64; bfloat16 is computed like float16).
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Elements converted to float64 at a time for dot products and the combination (bounds the scratch).
_CHUNK = 1 << 20


def coefficients(dot: float, a_norm_sq: float, b_norm_sq: float) -> tuple[float, float]:
    """The two coefficients of the rule for one tensor."""
    a_coeff = 1.0 - dot / a_norm_sq * 0.5 if a_norm_sq >= NORM_FLOOR else 1.0
    b_coeff = 1.0 - dot / b_norm_sq * 0.5 if b_norm_sq >= NORM_FLOOR else 1.0
    return a_coeff, b_coeff


def _segments(counts: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """(tensor index, begin, end) of the tensors' parts inside ``[start, stop)`` of the flat buffer."""
    out = []
    offset = 0
    for index, count in enumerate(counts):
        begin, end = max(offset, start), min(offset + count, stop)
        if begin < end:
            out.append((index, begin, end))
        offset += count
    return out


def _partial_dots(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    dot = a_sq = b_sq = 0.0
    for lo in range(0, a.numel(), _CHUNK):
        a64 = a[lo : lo + _CHUNK].to(torch.float64)
        b64 = b[lo : lo + _CHUNK].to(torch.float64)
        dot += float(torch.dot(a64, b64))
        a_sq += float(torch.dot(a64, a64))
        b_sq += float(torch.dot(b64, b64))
    return dot, a_sq, b_sq


def _scaled_add(out: torch.Tensor, a: torch.Tensor, a_coeff: float, b: torch.Tensor, b_coeff: float) -> None:
    """``out = a_coeff * a + b_coeff * b``, computed in float64 and rounded once (``out`` may be ``a``)."""
    for lo in range(0, out.numel(), _CHUNK):
        mixed = a[lo : lo + _CHUNK].to(torch.float64).mul_(a_coeff)
        mixed.add_(b[lo : lo + _CHUNK].to(torch.float64), alpha=b_coeff)
        out[lo : lo + _CHUNK].copy_(mixed)


def _pair(peers: Peers, flat: torch.Tensor, counts: Sequence[int], partner: int, lower: bool) -> None:
    """Replace ``flat`` on both members of a pair by adasum(lower's vector, upper's vector)."""
    n = flat.numel()
    mid = n // 2
    mine, theirs = ((0, mid), (mid, n)) if lower else ((mid, n), (0, mid))
    own = flat[mine[0] : mine[1]]
    other = torch.empty_like(own)
    peers.exchange(partner, flat[theirs[0] : theirs[1]], other)
    a, b = (own, other) if lower else (other, own)
    segments = _segments(counts, *mine)
    partials = torch.zeros(len(counts), 3, dtype=torch.float64)
    for index, begin, end in segments:
        local = slice(begin - mine[0], end - mine[0])
        partials[index] = torch.tensor(_partial_dots(a[local], b[local]), dtype=torch.float64)
    received = torch.empty_like(partials)
    peers.exchange(partner, partials, received)
    totals = (partials + received).tolist()  # addition commutes exactly: the same sums on both members
    for index, begin, end in segments:
        local = slice(begin - mine[0], end - mine[0])
        a_coeff, b_coeff = coefficients(*totals[index])
        _scaled_add(own[local], a[local], a_coeff, b[local], b_coeff)
    peers.exchange(partner, own, flat[theirs[0] : theirs[1]])


def adasum_allreduce(peers: Peers, flat: torch.Tensor, counts: Sequence[int]) -> None:
    """Replace the 1-D CPU tensor ``flat`` by the Adasum of every member's ``flat``, in place.

    ``counts`` are the element counts of the tensors laid end to end in ``flat`` (each gets its own
    coefficients). Every member calls this with the same shape, dtype and counts.
    """
    size, me = peers.size, peers.me
    level = 1
    while level < size:
        block = me - me % (2 * level)
        upper = block + level
        partners = min(level, size - upper)  # members of the upper half (0: nothing to combine)
        if partners > 0:
            if me >= upper:
                offset = me - upper
                _pair(peers, flat, counts, block + offset, lower=False)
                for lonely in range(offset + partners, level, partners):
                    peers.send(block + lonely, flat)
            elif me - block < partners:
                _pair(peers, flat, counts, upper + me - block, lower=True)
            else:
                peers.recv(upper + (me - block) % partners, flat)
        level *= 2


__all__ = ["DTYPES", "NORM_FLOOR", "adasum_allreduce", "coefficients"]
