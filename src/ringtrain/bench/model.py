"""A cost model of data-parallel training with ring allreduce and overlap, for every way of exchanging
gradients (docs/bench.md derives it).

Per step, with ``p`` ranks, for a method that sends ``W = G / r`` bytes per exchange in ``m`` allreduce
rounds per bucket:

    A(p, n) = 2 (p-1) alpha + 2 (p-1)/p * n / beta             ring allreduce of n bytes
    C(p)    = m k * 2 (p-1) alpha + 2 (p-1)/p * W / beta        one exchange: all k buckets, m rounds each
    L(p)    = m * 2 (p-1) alpha + 2 (p-1)/p * W_last / beta     the last bucket: ready when backward ends
    E(p)    = max(L(p), C(p) - f * T_bwd)                       what the backward pass cannot hide
    T(p)    = f * T_c + E(p)                                    step time
    eff(p)  = T_c / T(p)                                        weak scaling (per-rank batch fixed)

fp32: ``r = 1``, ``m = 1``; fp16 and bf16: ``r = 2``; PowerSGD: ``r`` from the gradients' shapes
(:func:`ringtrain.exchange.wire_cost`), ``m = 2`` (the factors P, then Q). Local SGD every ``H`` steps
exchanges nothing during backward: after every ``H``-th step the ranks average their parameter deltas in
one flat buffer, ``E(p) = A(p, G) / H``, none of it hidden.

``T_c`` is the single process's measured step time, ``T_bwd`` its backward part, ``G`` the fp32 gradient
bytes, ``k`` the number of gradient buckets (in backward order a first one of 1 MiB, then 25 MiB each of
fp32 gradients, as DDP and ringtrain's DistributedOptimizer cut them; ``W_last`` the last one's wire
share), ``alpha``/``beta`` the link's latency and bandwidth, and ``f >= 1`` the oversubscription of the
CPU (ranks x threads over cores on one host; 1 on a cluster with a core or GPU per rank). Strong
scaling divides ``T_c`` and ``T_bwd`` by ``p``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ringtrain.exchange import Method, local_sgd, parse_compression, wire_cost

BUCKET_BYTES = 25 * 1024 * 1024
"""Gradient bucket size of DDP and ringtrain's DistributedOptimizer (fp32 bytes)."""
FIRST_BUCKET_BYTES = 1024 * 1024
"""Their first bucket (the last layers' gradients, ready first) is smaller, to start sending early."""
DEFAULT_BACKWARD_SHARE = 0.6
"""Backward share of a step when it was not measured (backward costs about twice the forward pass)."""
PROJECTED_RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Interconnect:
    """A named link: nominal per-rank bandwidth and per-message latency of a collective step."""

    name: str
    description: str
    beta_bytes_per_s: float
    alpha_s: float


INTERCONNECTS: tuple[Interconnect, ...] = (
    # Nominal line rates; latencies are typical per-step costs of a collective library over each
    # (TCP stacks on Ethernet, RDMA on InfiniBand, NCCL's low-latency protocol on NVLink).
    Interconnect("25GbE", "25 Gbit/s Ethernet, TCP", 25e9 / 8, 20e-6),
    Interconnect("100GbE", "100 Gbit/s Ethernet, TCP", 100e9 / 8, 10e-6),
    Interconnect("IB-HDR200", "200 Gbit/s InfiniBand HDR, RDMA", 200e9 / 8, 3e-6),
    Interconnect("NVLink4", "NVLink 4, 450 GB/s per direction per GPU", 450e9, 3e-6),
)


FP32 = Method("none")
#: Bytes of one element on the wire against fp32's, for the methods whose ratio needs no shapes.
_CAST_RATIO = {"none": 1.0, "fp16": 2.0, "bf16": 2.0, "localsgd": 1.0}


@dataclass(frozen=True)
class StepModel:
    """What the model knows about one training step of a workload, and how its gradients travel."""

    compute_s: float
    """T_c: seconds per step of one process alone (measured: the baseline)."""
    backward_s: float
    """T_bwd: the backward part of ``compute_s``."""
    gradient_bytes: float
    """G: gradient bytes of fp32 parameters (before compression)."""
    method: Method = FP32
    """How gradients travel (:mod:`ringtrain.exchange`)."""
    wire_ratio: float | None = None
    """r: fp32 bytes over the bytes of one exchange. None: what the method's element size gives (fp16 and
    bf16 2, fp32 and Local SGD's fp32 deltas 1); PowerSGD's depends on the shapes (:meth:`for_shapes`)."""
    bucket_bytes: float = BUCKET_BYTES
    first_bucket_bytes: float = FIRST_BUCKET_BYTES
    strong: bool = False

    def __post_init__(self) -> None:
        if self.wire_ratio is None and self.method.name not in _CAST_RATIO:
            raise ValueError(f"method {self.method.label!r}: its bytes on the wire depend on the gradients' "
                             "shapes. HINT: use StepModel.for_shapes(compute_s, backward_s, shapes, method), "
                             "or give wire_ratio=.")

    @classmethod
    def for_shapes(cls, compute_s: float, backward_s: float, shapes: Iterable[Sequence[int]],
                   method: Method = FP32, strong: bool = False) -> StepModel:
        """The model of a step whose trainable parameters have ``shapes`` (fp32), exchanged by ``method``."""
        cost = wire_cost(shapes, method)
        # one exchange's bytes: Local SGD's per-step figure is one averaging spread over its H steps
        every = (method.sync_every or 1) if method.name == "localsgd" else 1
        per_exchange = cost.bytes_per_step * every
        ratio = cost.gradient_bytes / per_exchange if per_exchange else 1.0
        return cls(compute_s, backward_s, float(cost.gradient_bytes), method, ratio, strong=strong)

    @property
    def ratio(self) -> float:
        """r: how many times fewer bytes than fp32 gradients one exchange sends."""
        return self.wire_ratio if self.wire_ratio is not None else _CAST_RATIO[self.method.name]

    @property
    def rounds(self) -> int:
        """m: allreduce rounds per bucket (PowerSGD 2: P, then Q)."""
        return 2 if self.method.name == "powersgd" else 1

    @property
    def sync_every(self) -> int:
        """H: steps per exchange (Local SGD's; 1 for the others)."""
        return (self.method.sync_every or 1) if self.method.name == "localsgd" else 1

    @property
    def fp16(self) -> bool:
        """True for fp16 gradients (result files before the other methods said ``fp16``)."""
        return self.method.name == "fp16"

    @property
    def wire_bytes(self) -> float:
        """W: bytes of one exchange (Local SGD: one averaging)."""
        return self.gradient_bytes / self.ratio

    @property
    def wire_bytes_per_step(self) -> float:
        """W / H: bytes per step."""
        return self.wire_bytes / self.sync_every

    def bucket_sizes(self) -> list[float]:
        """Wire bytes of each bucket, in the order backward makes them ready (Local SGD: one flat buffer,
        averaged after the step)."""
        if self.method.name == "localsgd":
            return [self.wire_bytes]
        sizes = [min(self.gradient_bytes, self.first_bucket_bytes)]
        rest = self.gradient_bytes - sizes[0]
        if rest > 0:
            full = math.ceil(rest / self.bucket_bytes)
            sizes += [self.bucket_bytes] * (full - 1) + [rest - self.bucket_bytes * (full - 1)]
        return [s / self.ratio for s in sizes]

    @property
    def buckets(self) -> int:
        return len(self.bucket_sizes())


def ring_allreduce_s(p: int, nbytes: float, alpha: float, beta: float) -> float:
    """A(p, n): seconds of a ring allreduce of ``nbytes`` over ``p`` ranks (0 for one rank)."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


@dataclass(frozen=True)
class Prediction:
    """The model's step time at ``p`` ranks and its parts."""

    ranks: int
    step_s: float
    compute_s: float
    communication_s: float
    """C(p) per step (Local SGD: C / H): all of it, hidden or not."""
    exposed_s: float
    """E(p): the part that adds to the step."""
    efficiency: float
    latency_bound: bool
    """True when the latency terms outweigh the bandwidth term: real libraries switch to tree or
    hierarchical algorithms there, so the ring model is pessimistic."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(step: StepModel, p: int, alpha: float, beta: float, oversubscription: float = 1.0) -> Prediction:
    """Step time and weak-scaling efficiency (strong, if ``step.strong``) at ``p`` ranks."""
    if p < 1:
        raise ValueError(f"p={p} ranks: must be at least 1. HINT: use p=1 or more.")
    f = max(1.0, oversubscription)
    share = 1.0 / p if step.strong else 1.0
    compute = f * step.compute_s * share
    backward = f * step.backward_s * share
    sizes = step.bucket_sizes()
    messages = step.rounds * len(sizes)
    latency = messages * 2 * (p - 1) * alpha if p > 1 else 0.0
    bandwidth = 2 * (p - 1) / p * step.wire_bytes / beta if p > 1 else 0.0
    exchange = latency + bandwidth
    if p <= 1:
        exposed = 0.0
    elif step.method.name == "localsgd":
        # averaged after the H-th step, when no backward pass runs: nothing hides it
        exposed = exchange / step.sync_every
    else:
        last = step.rounds * 2 * (p - 1) * alpha + 2 * (p - 1) / p * sizes[-1] / beta
        exposed = max(last, exchange - backward)
    step_s = compute + exposed
    ideal = step.compute_s * share
    return Prediction(ranks=p, step_s=step_s, compute_s=compute, communication_s=exchange / step.sync_every,
                      exposed_s=exposed, efficiency=ideal / step_s if step_s > 0 else 1.0,
                      latency_bound=latency > bandwidth)


def project(step: StepModel, interconnects: tuple[Interconnect, ...] = INTERCONNECTS,
            ranks: tuple[int, ...] = PROJECTED_RANKS) -> list[dict[str, Any]]:
    """Projected efficiency of ``step`` on each interconnect at each rank count (one process per device)."""
    out = []
    for link in interconnects:
        predictions = [predict(step, p, link.alpha_s, link.beta_bytes_per_s) for p in ranks]
        out.append({"interconnect": link.name, "description": link.description,
                    "beta_bytes_per_s": link.beta_bytes_per_s, "alpha_s": link.alpha_s,
                    "method": step.method.label, "fp16": step.fp16,
                    "points": [pr.as_dict() for pr in predictions]})
    return out


def method_from_label(text: str | Method) -> Method:
    """``fp32`` (or ``none``), ``fp16``, ``bf16``, ``powersgd``, ``powersgd:R``, ``localsgd:H`` -> a
    :class:`~ringtrain.exchange.Method` (a Method is returned as it is); a ValueError names the fix."""
    if isinstance(text, Method):
        return text
    word = str(text).strip().lower()
    name, _, number = word.partition(":")
    if name == "localsgd":
        if number.isdigit() and int(number) >= 1:
            return local_sgd(int(number))
        raise ValueError(f"method {text!r}: Local SGD needs the steps between averagings. HINT: write e.g. "
                         "'localsgd:8'.")
    if word == "auto":
        raise ValueError("method 'auto' is a rule, not a method: it picks one of the others. HINT: compare "
                         "the methods themselves, e.g. ['fp32', 'fp16', 'powersgd:4', 'localsgd:8'].")
    return parse_compression(word)


#: What :func:`best_method` compares when not told.
DEFAULT_METHODS = ("fp32", "fp16", "powersgd:4", "localsgd:8")


def best_method(step_compute_s: float, backward_s: float, shapes: Iterable[Sequence[int]], ranks: int,
                alpha_s: float, beta_bytes_per_s: float,
                methods: Sequence[str | Method] = DEFAULT_METHODS, *, oversubscription: float = 1.0,
                strong: bool = False) -> dict[str, Prediction]:
    """The predicted step of a model with trainable parameters of ``shapes``, whose step takes
    ``step_compute_s`` on one device alone (``backward_s`` of it the backward pass), at ``ranks`` ranks on a
    link of ``alpha_s`` latency and ``beta_bytes_per_s`` bandwidth, for each of ``methods``: by label
    (``fp32``, ``powersgd:4``, ...), fastest first. Step time only: what PowerSGD and Local SGD cost in
    accuracy, and PowerSGD's matrix work, are not in it (docs/bench.md)."""
    shapes = [tuple(int(d) for d in s) for s in shapes]
    out = []
    for text in methods:
        method = method_from_label(text)
        step = StepModel.for_shapes(step_compute_s, backward_s, shapes, method, strong=strong)
        out.append((method.label, predict(step, ranks, alpha_s, beta_bytes_per_s, oversubscription)))
    out.sort(key=lambda item: item[1].step_s)  # stable: a tie keeps the order given
    return dict(out)


#: A method other than fp32 "pays" only when its predicted step is at least this much shorter than
#: fp32's: below that the gain is within the model's own error (docs/bench.md), and compressing or
#: averaging less often costs accuracy that fp32 does not.
PAYS_MARGIN = 0.05


def method_that_pays(steps: Sequence[StepModel], interconnects: Sequence[Interconnect] = INTERCONNECTS,
                     ranks: Sequence[int] = PROJECTED_RANKS,
                     margin: float = PAYS_MARGIN) -> list[dict[str, Any]]:
    """For each interconnect and rank count: every method's predicted step time (``step_s`` by label), the
    ``fastest``, and the method that ``pays``: the fastest when its step is at least ``margin`` shorter
    than fp32's, else fp32 (the fastest, when fp32 is not among ``steps``)."""
    out = []
    for link in interconnects:
        points = []
        for p in ranks:
            times = {s.method.label: predict(s, p, link.alpha_s, link.beta_bytes_per_s).step_s for s in steps}
            fastest = min(times, key=lambda label: times[label])
            plain = times.get(FP32.label)
            pays = fastest if plain is None or times[fastest] <= (1 - margin) * plain else FP32.label
            points.append({"ranks": p, "fastest": fastest, "pays": pays, "step_s": times})
        out.append({"interconnect": link.name, "description": link.description,
                    "beta_bytes_per_s": link.beta_bytes_per_s, "alpha_s": link.alpha_s, "points": points})
    return out


def parse_interconnect(text: str) -> Interconnect:
    """``NAME=GBIT:USEC`` (e.g. ``roce=100:3``) -> an Interconnect; a ValueError names the fix."""
    name, sep, rest = text.partition("=")
    gbit, sep2, usec = rest.partition(":")
    try:
        if not (name and sep and sep2):
            raise ValueError
        bandwidth, latency = float(gbit), float(usec)
        if bandwidth <= 0 or latency < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"--interconnect {text!r} is not NAME=GBIT_PER_S:LATENCY_US. HINT: write e.g. "
                         "--interconnect roce100=100:3 (100 Gbit/s, 3 microseconds).") from None
    return Interconnect(name, f"{bandwidth:g} Gbit/s, {latency:g} us (given)", bandwidth * 1e9 / 8,
                        latency * 1e-6)
