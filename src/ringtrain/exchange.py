"""How gradients cross the link: the methods a job can use, what each puts on the wire, and the rule
that picks one from the measured link.

The methods, as ``--compression`` (and ``--sync-every`` for Local SGD) name them:

- ``none``: fp32 gradients, allreduced every step;
- ``fp16`` / ``bf16``: every floating gradient cast to 16 bits on the wire (half the bytes);
- ``powersgd:R``: each gradient matrix sent as two rank-``R`` factors with error feedback (PowerSGD);
  1-D tensors and matrices too small to pay travel as they are;
- ``localsgd:H``: no gradient exchange; every ``H`` steps the parameter deltas are averaged (Local SGD,
  DiLoCo), the fp32 bytes of one exchange spread over ``H`` steps.

:func:`wire_cost` counts the bytes one rank hands to its allreduces per optimizer step for a model's
gradient shapes; :func:`choose` is the rule behind ``--compression auto``. Both are plain arithmetic on
shapes: nothing here touches a tensor or a process group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: PowerSGD's rank when ``powersgd`` is given without one.
DEFAULT_POWERSGD_RANK = 4
#: A matrix is sent compressed only when it shrinks at least this much (``n m > rate R (n + m)``).
MIN_COMPRESSION_RATE = 2.0
#: ``--compression auto`` keeps the exchange of every step under this many seconds on the measured link.
AUTO_BUDGET_S = 0.05
#: PowerSGD's rank that ``--compression auto`` picks.
AUTO_POWERSGD_RANK = 4
#: Bytes of one element on the wire: fp32, or the 16-bit casts.
_ELEMENT_BYTES = {"none": 4, "fp16": 2, "bf16": 2, "powersgd": 4, "localsgd": 4}
_WORDS = ("none", "fp16", "bf16", "powersgd", "powersgd:R", "auto")


@dataclass(frozen=True)
class Method:
    """One way of exchanging gradients (see the module's docstring)."""

    name: str
    """``none``, ``fp16``, ``bf16``, ``powersgd``, ``localsgd`` or ``auto`` (not decided yet)."""
    rank: int | None = None
    """PowerSGD's rank."""
    sync_every: int | None = None
    """Local SGD's steps between two exchanges."""

    @property
    def label(self) -> str:
        """``fp32``, ``fp16``, ``powersgd:4``, ``localsgd:8``: how tables and logs name it."""
        if self.name == "none":
            return "fp32"
        if self.name == "powersgd":
            return f"powersgd:{self.rank}"
        if self.name == "localsgd":
            return f"localsgd:{self.sync_every}"
        return self.name

    @property
    def compression(self) -> str:
        """The ``--compression`` word that selects it (``powersgd:4``; Local SGD's is ``none``)."""
        if self.name == "powersgd":
            return f"powersgd:{self.rank}"
        return "none" if self.name == "localsgd" else self.name


def parse_compression(text: str) -> Method:
    """``--compression``'s value -> a :class:`Method`; a ValueError names the value and the fix."""
    word = str(text).strip().lower()
    if word in ("none", "fp32"):
        return Method("none")
    if word in ("fp16", "bf16", "auto"):
        return Method(word)
    name, sep, rank_text = word.partition(":")
    if name == "powersgd":
        if not sep:
            return Method("powersgd", rank=DEFAULT_POWERSGD_RANK)
        try:
            rank = int(rank_text)
        except ValueError:
            rank = 0
        if rank >= 1:
            return Method("powersgd", rank=rank)
        raise ValueError(f"compression={text!r}: PowerSGD's rank must be a whole number of at least 1. "
                         "HINT: use e.g. compression='powersgd:4' (--compression powersgd:4).")
    raise ValueError(f"compression={text!r} is not known. HINT: use one of {', '.join(_WORDS)} "
                     "(e.g. compression='powersgd:4').")


def local_sgd(sync_every: int) -> Method:
    """Local SGD (or DiLoCo) averaging every ``sync_every`` steps."""
    return Method("localsgd", sync_every=sync_every)


def matrix_view(shape: Sequence[int]) -> tuple[int, int] | None:
    """``(n, m)``: a gradient of ``shape`` seen as a matrix, its first dimension by all the others;
    None for a tensor of fewer than two dimensions (biases, norms), which PowerSGD never compresses."""
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def powersgd_compresses(shape: Sequence[int], rank: int, min_rate: float = MIN_COMPRESSION_RATE) -> bool:
    """Whether PowerSGD sends a gradient of ``shape`` as rank-``rank`` factors: only a matrix whose
    factors ``n x R`` and ``m x R`` are at least ``min_rate`` times smaller than the matrix itself."""
    view = matrix_view(shape)
    if view is None:
        return False
    n, m = view
    return n * m > min_rate * rank * (n + m)


@dataclass(frozen=True)
class WireCost:
    """What one rank hands to allreduces for a model's gradients, per optimizer step."""

    method: Method
    gradient_bytes: int
    """The fp32 bytes of every gradient: what ``none`` sends each step."""
    bytes_per_step: float
    """The method's bytes per step (Local SGD: one exchange's bytes over its ``H`` steps)."""
    exchanges_per_step: float
    """Allreduce rounds per gradient bucket and step: 1; PowerSGD 2 (its two factors); Local SGD 1 / H."""
    compressed_tensors: int = 0
    """PowerSGD: the gradients sent as factors."""
    tensors: int = 0

    @property
    def ratio(self) -> float:
        """How many times fewer bytes than fp32 gradients every step."""
        return self.gradient_bytes / self.bytes_per_step if self.bytes_per_step else math.inf

    def describe(self) -> str:
        """``powersgd:4: 0.52 MB a step, 90.1x fewer bytes than fp32 (42 of 62 tensors compressed)``."""
        text = f"{self.method.label}: {_megabytes(self.bytes_per_step)} a step"
        if self.method.name != "none":
            text += f", {self.ratio:.1f}x fewer bytes than fp32"
        if self.method.name == "powersgd":
            text += f" ({self.compressed_tensors} of {self.tensors} tensors compressed)"
        return text


def _megabytes(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB"


def wire_cost(shapes: Iterable[Sequence[int]], method: Method) -> WireCost:
    """The bytes ``method`` puts on the wire per step for gradients of ``shapes`` (fp32 parameters)."""
    shapes = [tuple(int(d) for d in s) for s in shapes]
    elements = [math.prod(s) for s in shapes]
    gradient_bytes = 4 * sum(elements)
    if method.name == "auto":
        raise ValueError("compression='auto' has no cost until it is decided. HINT: call choose() first.")
    if method.name == "powersgd":
        rank = method.rank or DEFAULT_POWERSGD_RANK
        sent, compressed = 0, 0
        for shape, count in zip(shapes, elements):
            if powersgd_compresses(shape, rank):
                n, m = matrix_view(shape) or (0, 0)
                sent += rank * (n + m)
                compressed += 1
            else:
                sent += count
        return WireCost(method, gradient_bytes, 4.0 * sent, 2.0, compressed, len(shapes))
    if method.name == "localsgd":
        every = method.sync_every or 1
        return WireCost(method, gradient_bytes, gradient_bytes / every, 1.0 / every, 0, len(shapes))
    return WireCost(method, gradient_bytes, float(_ELEMENT_BYTES[method.name] * sum(elements)), 1.0, 0,
                    len(shapes))


def ring_seconds(ranks: int, nbytes: float, alpha_s: float, beta_bytes_per_s: float,
                 rounds: float = 1.0) -> float:
    """A ring allreduce of ``nbytes`` over ``ranks`` ranks, ``rounds`` times (latency each time)."""
    if ranks <= 1:
        return 0.0
    return rounds * 2 * (ranks - 1) * alpha_s + 2 * (ranks - 1) / ranks * nbytes / beta_bytes_per_s


def exchange_seconds(cost: WireCost, ranks: int, alpha_s: float, beta_bytes_per_s: float) -> float:
    """Seconds per step that ``cost``'s exchange takes on a link of ``alpha_s`` and ``beta_bytes_per_s``."""
    return ring_seconds(ranks, cost.bytes_per_step, alpha_s, beta_bytes_per_s, cost.exchanges_per_step)


@dataclass(frozen=True)
class Choice:
    """What ``--compression auto`` chose, and why, in one line."""

    method: Method
    reason: str


def choose(shapes: Iterable[Sequence[int]], ranks: int, alpha_s: float, beta_bytes_per_s: float,
           budget_s: float = AUTO_BUDGET_S) -> Choice:
    """The rule of ``--compression auto`` (docs/slow-links.md):

    1. one rank, or fp32 gradients exchanged within ``budget_s`` a step on the measured link: ``none``
       (compression would only cost accuracy or compute);
    2. else fp16 within the budget: ``fp16`` (half the bytes, no state, Horovod's own);
    3. else PowerSGD at rank 4 where it shrinks the gradients at least 4x more than fp16 does;
    4. else ``fp16``, the best that remains.

    The rule knows the link and the gradients, not the step time: ``ringtrain bench`` measures that
    and its cost model says which method pays for a given step.
    """
    shapes = [tuple(s) for s in shapes]
    fp32 = wire_cost(shapes, Method("none"))
    link = f"{beta_bytes_per_s * 8 / 1e9:.3g} Gbit/s, {alpha_s * 1e6:.0f} us"
    size = f"{_megabytes(fp32.gradient_bytes)} of fp32 gradients"
    if ranks <= 1:
        return Choice(Method("none"), "one rank: no gradient crosses a link")
    t32 = exchange_seconds(fp32, ranks, alpha_s, beta_bytes_per_s)
    if t32 <= budget_s:
        return Choice(Method("none"), f"{size} take {t32 * 1e3:.0f} ms a step on this link ({link}), within "
                                      f"the {budget_s * 1e3:.0f} ms budget")
    fp16 = wire_cost(shapes, Method("fp16"))
    t16 = exchange_seconds(fp16, ranks, alpha_s, beta_bytes_per_s)
    if t16 <= budget_s:
        return Choice(Method("fp16"), f"{size} take {t32 * 1e3:.0f} ms a step on this link ({link}); as fp16 "
                                      f"{t16 * 1e3:.0f} ms, within the {budget_s * 1e3:.0f} ms budget")
    low_rank = wire_cost(shapes, Method("powersgd", rank=AUTO_POWERSGD_RANK))
    if low_rank.ratio >= 4 * fp16.ratio:
        tp = exchange_seconds(low_rank, ranks, alpha_s, beta_bytes_per_s)
        return Choice(low_rank.method, f"{size} take {t32 * 1e3:.0f} ms a step on this link ({link}), fp16 "
                                       f"{t16 * 1e3:.0f} ms; PowerSGD at rank {AUTO_POWERSGD_RANK} sends "
                                       f"{low_rank.ratio:.0f}x fewer bytes: {tp * 1e3:.0f} ms")
    return Choice(Method("fp16"), f"{size} take {t32 * 1e3:.0f} ms a step on this link ({link}); PowerSGD "
                                  f"would shrink them only {low_rank.ratio:.1f}x (few large matrices), fp16 "
                                  f"halves them: {t16 * 1e3:.0f} ms")


__all__ = ["AUTO_BUDGET_S", "Choice", "Method", "WireCost", "choose", "exchange_seconds", "local_sgd",
           "matrix_view", "parse_compression", "powersgd_compresses", "ring_seconds", "wire_cost"]
