"""The link between two ranks, measured: latency ``alpha`` and bandwidth ``beta`` of an allreduce.

``python -m ringtrain.bench.link`` runs on two ranks (started by ``ringtrain run -np 2``, across two
hosts with ``-H a:1,b:1``). They allreduce float32 tensors of known sizes with ringtrain's engine
(``hvd.allreduce_``, the path the Horovod strategy's gradients take) and rank 0 prints the median
time of each size as a report line. ``fit_link`` fits the ring allreduce cost of two ranks,

    T(n) = 2 (p - 1) alpha + 2 (p - 1) / p * n / beta   =   2 alpha + n / beta   (p = 2),

by least squares on relative error (small and large sizes weigh alike). ``alpha`` and ``beta`` are
*effective* values: they include the engine's negotiation round and the kernel's TCP stack, which is
what a gradient allreduce pays too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SIZES = (4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
"""Bytes per allreduce: latency-bound up to bandwidth-bound on any link from 100 Mbit/s to loopback."""


def repeats_for(size: int) -> int:
    """Timed repeats of one size (the same on both ranks: collectives must match)."""
    return 9 if size <= 1 << 20 else 5 if size <= 4 << 20 else 3


@dataclass
class LinkFit:
    """A measured link: the fitted cost and the samples it came from."""

    alpha_s: float
    """Latency per message (seconds)."""
    beta_bytes_per_s: float
    """Bandwidth (bytes per second)."""
    samples: list[dict[str, float]] = field(default_factory=list)
    """``{"bytes": n, "seconds": median time}`` per size."""
    max_relative_error: float = 0.0
    """Largest ``|fit - measured| / measured`` over the samples: how well two numbers describe the link."""
    ranks: int = 2
    hosts: list[str] = field(default_factory=list)
    method: str = "ringtrain allreduce_ (engine ring), float32, 2 ranks, median of repeats"
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> LinkFit:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in body.items() if k in known})

    def describe(self) -> str:
        """``1.02 Gbit/s, 85 us latency (hostA-hostB)``."""
        where = f" ({'-'.join(self.hosts)})" if self.hosts else ""
        return f"{format_rate(self.beta_bytes_per_s)}, {self.alpha_s * 1e6:.0f} us latency{where}"


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second as Gbit/s or Mbit/s."""
    bits = bytes_per_s * 8
    if bits >= 1e9:
        return f"{bits / 1e9:.3g} Gbit/s"
    return f"{bits / 1e6:.3g} Mbit/s"


def fit_link(samples: Sequence[tuple[float, float]], ranks: int = 2) -> LinkFit:
    """Fit ``T(n) = 2(p-1) alpha + 2(p-1)/p n / beta`` to ``(bytes, seconds)`` samples.

    Weighted least squares with weights 1/T^2 (relative error). A negative intercept (latency lost
    in the noise) is clamped to zero and the bandwidth refitted through the origin.
    """
    if len(samples) < 2:
        raise ValueError(f"{len(samples)} sample(s) cannot fix latency and bandwidth. HINT: measure at least "
                         "two message sizes.")
    xs = [float(n) for n, _ in samples]
    ys = [float(t) for _, t in samples]
    ws = [1.0 / (t * t) for t in ys]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs))
    sy = sum(w * y for w, y in zip(ws, ys))
    sxx = sum(w * x * x for w, x in zip(ws, xs))
    sxy = sum(w * x * y for w, x, y in zip(ws, xs, ys))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ValueError("the samples all have the same size. HINT: measure at least two message sizes.")
    slope = (sw * sxy - sx * sy) / det
    intercept = (sy - slope * sx) / sw
    if intercept < 0:
        intercept = 0.0
        slope = sxy / sxx
    if slope <= 0:
        raise ValueError(f"the times do not grow with the message size ({samples}). HINT: measure larger "
                         "sizes, or on a quieter machine.")
    hops = 2 * (ranks - 1)
    alpha = intercept / hops
    beta = hops / ranks / slope
    errors = [abs(intercept + slope * x - y) / y for x, y in zip(xs, ys)]
    return LinkFit(alpha_s=alpha, beta_bytes_per_s=beta, ranks=ranks, max_relative_error=max(errors),
                   samples=[{"bytes": x, "seconds": y} for x, y in zip(xs, ys)])


def probe(sizes: Sequence[int] = SIZES) -> dict[str, Any] | None:
    """Measure on this rank (both ranks call it); rank 0 gets the samples, the other rank None."""
    import socket

    import torch

    import ringtrain as hvd

    hvd.init()
    try:
        torch.set_num_threads(1)
        times = []
        for size in sizes:
            tensor = torch.ones(size // 4, dtype=torch.float32)
            name = f"ringtrain.bench.link.{size}"
            for _ in range(2):  # warm-up: first contact, response cache, buffers
                hvd.allreduce_(tensor, name=name, op=hvd.Sum)
            runs = []
            for _ in range(repeats_for(size)):
                start = time.perf_counter()
                hvd.allreduce_(tensor, name=name, op=hvd.Sum)
                runs.append(time.perf_counter() - start)
            # the slower rank's time is the collective's time
            mine = torch.tensor([statistics.median(runs)], dtype=torch.float64)
            times.append(float(hvd.allreduce(mine, name=f"{name}.time", op=hvd.Max)))
        hosts = hvd.allgather_object(socket.gethostname())
        if hvd.rank() != 0:
            return None
        return {"link_samples": [[s, t] for s, t in zip(sizes, times)], "ranks": hvd.size(), "hosts": hosts}
    finally:
        hvd.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ringtrain.bench.link [--sizes 4096,1048576]``, on two ranks."""
    parser = argparse.ArgumentParser(prog="python -m ringtrain.bench.link")
    parser.add_argument("--sizes", help="comma-separated message sizes in bytes (multiples of 4)")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else SIZES
    body = probe(sizes)
    if body is not None:
        from ringtrain.bench.hook import TAG

        print(f"{TAG} {json.dumps(body)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
