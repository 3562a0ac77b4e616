"""A cost model of data-parallel training with ring allreduce and overlap (docs/bench.md derives it).

Per step, with ``p`` ranks:

    A(p, n) = 2 (p-1) alpha + 2 (p-1)/p * n / beta         ring allreduce of n bytes
    C(p)    = k * 2 (p-1) alpha + 2 (p-1)/p * G / beta      all k buckets of G gradient bytes
    L(p)    = A(p, G_last)                                  the last bucket: ready when backward ends
    E(p)    = max(L(p), C(p) - f * T_bwd)                   communication the backward pass cannot hide
    T(p)    = f * T_c + E(p)                                step time
    eff(p)  = T_c / T(p)                                    weak scaling (per-rank batch fixed)

``T_c`` is the single process's measured step time, ``T_bwd`` its backward part, ``G`` the bytes on
the wire (halved by fp16 compression), ``k`` the number of gradient buckets (in backward order a
first one of 1 MiB, then 25 MiB each, as DDP and ringtrain's DistributedOptimizer cut them; ``G_last``
the last one's share), ``alpha``/``beta`` the link's latency and bandwidth, and
``f >= 1`` the oversubscription of the CPU (ranks x threads over cores on one host; 1 on a cluster
with a core or GPU per rank). Strong scaling divides ``T_c`` and ``T_bwd`` by ``p``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

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


@dataclass(frozen=True)
class StepModel:
    """What the model knows about one training step of a workload."""

    compute_s: float
    """T_c: seconds per step of one process alone (measured: the baseline)."""
    backward_s: float
    """T_bwd: the backward part of ``compute_s``."""
    gradient_bytes: float
    """G: gradient bytes of fp32 parameters (before compression)."""
    fp16: bool = False
    bucket_bytes: float = BUCKET_BYTES
    first_bucket_bytes: float = FIRST_BUCKET_BYTES
    strong: bool = False

    @property
    def wire_bytes(self) -> float:
        return self.gradient_bytes / 2 if self.fp16 else self.gradient_bytes

    def bucket_sizes(self) -> list[float]:
        """Wire bytes of each bucket, in the order backward makes them ready."""
        sizes = [min(self.gradient_bytes, self.first_bucket_bytes)]
        rest = self.gradient_bytes - sizes[0]
        if rest > 0:
            full = math.ceil(rest / self.bucket_bytes)
            sizes += [self.bucket_bytes] * (full - 1) + [rest - self.bucket_bytes * (full - 1)]
        scale = 0.5 if self.fp16 else 1.0
        return [s * scale for s in sizes]

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
    """C(p): all of it, hidden or not."""
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
    k = step.buckets
    latency = k * 2 * (p - 1) * alpha if p > 1 else 0.0
    bandwidth = 2 * (p - 1) / p * step.wire_bytes / beta if p > 1 else 0.0
    total = latency + bandwidth
    last = ring_allreduce_s(p, step.bucket_sizes()[-1], alpha, beta)
    exposed = max(last, total - backward) if p > 1 else 0.0
    step_s = compute + exposed
    ideal = step.compute_s * share
    return Prediction(ranks=p, step_s=step_s, compute_s=compute, communication_s=total, exposed_s=exposed,
                      efficiency=ideal / step_s if step_s > 0 else 1.0, latency_bound=latency > bandwidth)


def project(step: StepModel, interconnects: tuple[Interconnect, ...] = INTERCONNECTS,
            ranks: tuple[int, ...] = PROJECTED_RANKS) -> list[dict[str, Any]]:
    """Projected efficiency of ``step`` on each interconnect at each rank count (one process per device)."""
    out = []
    for link in interconnects:
        predictions = [predict(step, p, link.alpha_s, link.beta_bytes_per_s) for p in ranks]
        out.append({"interconnect": link.name, "description": link.description,
                    "beta_bytes_per_s": link.beta_bytes_per_s, "alpha_s": link.alpha_s, "fp16": step.fp16,
                    "points": [pr.as_dict() for pr in predictions]})
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
