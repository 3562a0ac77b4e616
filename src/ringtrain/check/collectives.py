"""The collective checks of ``ringtrain check``: every collective against a value each rank recomputes.

Every check builds each rank's contribution from a deterministic function of the rank, so any rank can
compute the exact expected result locally and compare it with what the collective returned; a wrong
answer is reported with the first mismatching value, not just "failed".
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from ringtrain.check.report import BandwidthSample, CheckResult

#: Reduce ops checked with allreduce, by their Horovod names.
ALLREDUCE_OPS: tuple[str, ...] = ("Sum", "Average", "Min", "Max", "Product", "Adasum")

#: Default message sizes of the bandwidth sweep, in bytes (float32 payloads).
DEFAULT_BANDWIDTH_SIZES: tuple[int, ...] = (4 << 10, 256 << 10, 4 << 20)

#: Tolerances of a floating result against the local reduction (torch.isclose's rtol and atol).
_RTOL, _ATOL = 1e-5, 1e-6


# --- expected values: a pure function of (rank, size) so every rank can recompute them ----------

def _contribution(rank: int, length: int, device: torch.device) -> torch.Tensor:
    """Rank ``rank``'s allreduce input: small integers, exact in float32, different on each rank."""
    return (torch.arange(length, dtype=torch.float32, device=device) % 7) + rank


def _product_contribution(rank: int, length: int, device: torch.device) -> torch.Tensor:
    """Values near 1, so that a product over many ranks neither overflows nor underflows."""
    return 1.0 + 0.01 * ((torch.arange(length, device=device) + rank) % 5).float()


def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    """A short description of where ``got`` and ``want`` differ."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    bad = (~torch.isclose(got.double(), want.double(), rtol=_RTOL, atol=_ATOL)).nonzero()
    index = tuple(bad[0].tolist())
    return (f"{len(bad)} of {want.numel()} values wrong; first at index {index}: "
            f"got {got[index].item()}, expected {want[index].item()}")


def _compare(name: str, got: Any, want: torch.Tensor) -> CheckResult:
    if not isinstance(got, torch.Tensor):
        return CheckResult(name, False, f"returned {type(got).__name__}, expected a tensor")
    got_cpu, want_cpu = got.detach().cpu(), want.detach().cpu()
    if (got_cpu.shape == want_cpu.shape and got_cpu.dtype == want_cpu.dtype
            and torch.allclose(got_cpu.double(), want_cpu.double(), rtol=_RTOL, atol=_ATOL)):
        return CheckResult(name, True)
    return CheckResult(name, False, _first_mismatch(got_cpu, want_cpu))


# --- the checks --------------------------------------------------------------------------------

def check_allreduce(hvd: ModuleType, op_name: str, device: torch.device, length: int = 33) -> CheckResult:
    """allreduce with ``op_name`` (a Horovod op name) against the locally computed reduction."""
    rank, size = hvd.rank(), hvd.size()
    name = f"allreduce[{op_name.lower()}]"
    if op_name == "Adasum":
        # Adasum of mutually orthogonal vectors is their plain sum: one-hot rows give all ones; where
        # ranks are averaged within their host first (CUDA tensors, as Horovod's NCCL build, or
        # hierarchical allreduce), rank r's entry is 1 / (ranks on r's host).
        mine = torch.zeros(size, device=device)
        mine[rank] = 1.0
        want = torch.tensor([1.0 / n for n in _adasum_host_sizes(size, device)], device=device)
    elif op_name == "Product":
        mine = _product_contribution(rank, length, device)
        want = torch.stack([_product_contribution(r, length, device) for r in range(size)]).prod(0)
    else:
        mine = _contribution(rank, length, device)
        stacked = torch.stack([_contribution(r, length, device) for r in range(size)])
        want = {"Sum": lambda: stacked.sum(0), "Average": lambda: stacked.mean(0),
                "Min": lambda: stacked.min(0).values, "Max": lambda: stacked.max(0).values}[op_name]()
    before = mine.clone()
    try:
        got = hvd.allreduce(mine, name=f"check.{name}", op=getattr(hvd, op_name))
    except NotImplementedError as exc:
        return CheckResult(name, True, f"not supported here: {exc}", skipped=True)
    result = _compare(name, got, want)
    if result.ok and not torch.equal(mine, before):
        return CheckResult(name, False, "allreduce changed its input tensor (it must be out-of-place)")
    return result


def _adasum_host_sizes(size: int, device: torch.device) -> list[int]:
    """For each rank, how many ranks Adasum averages it with first (1 where it does not)."""
    from ringtrain.engine import state

    # The engine of this process, when the API checked is ringtrain's own (a stand-in API has none).
    engine = state.engine
    hierarchy = engine.sets[0].extra.get("hierarchy") if engine is not None else None
    index = -1
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    if hierarchy is None or not hierarchy.adasum_by_host(index):
        return [1] * size
    return [next(len(host) for host in hierarchy.hosts if r in host) for r in range(size)]


def check_allreduce_large(hvd: ModuleType, device: torch.device, numel: int = 1 << 20) -> CheckResult:
    """A 4 MiB Sum: large tensors take another path than small ones (the socket ring, gloo or NCCL)."""
    name = "allreduce[large]"
    size = hvd.size()
    got = hvd.allreduce(_contribution(hvd.rank(), numel, device), name=f"check.{name}", op=hvd.Sum)
    # Rank r sends pattern + r, so the sum is size * pattern + (0 + 1 + ... + size - 1).
    return _compare(name, got, _contribution(0, numel, device) * size + size * (size - 1) // 2)


def check_allreduce_int(hvd: ModuleType, device: torch.device) -> CheckResult:
    """Integer Sum: catches a path that silently goes through floats."""
    rank, size = hvd.rank(), hvd.size()
    big = 1 << 40  # not representable exactly in float32 when combined with small values
    mine = torch.tensor([big + rank, rank], dtype=torch.int64, device=device)
    want = torch.tensor([big * size + size * (size - 1) // 2, size * (size - 1) // 2], dtype=torch.int64)
    got = hvd.allreduce(mine, name="check.allreduce[int64]", op=hvd.Sum)
    if isinstance(got, torch.Tensor) and got.dtype == torch.int64 and torch.equal(got.cpu(), want):
        return CheckResult("allreduce[int64]", True)
    shown = got.tolist() if isinstance(got, torch.Tensor) else got
    return CheckResult("allreduce[int64]", False, f"got {shown} ({getattr(got, 'dtype', '?')}), "
                                                  f"expected {want.tolist()} (torch.int64)")


def check_allgather(hvd: ModuleType, device: torch.device) -> CheckResult:
    """allgather where rank r sends r+1 rows: first dimensions differ, as Horovod allows."""
    rank, size = hvd.rank(), hvd.size()

    def rows(r: int) -> torch.Tensor:
        return torch.full((r + 1, 3), float(r), device=device) + torch.arange(3, device=device)

    got = hvd.allgather(rows(rank), name="check.allgather")
    return _compare("allgather[uneven]", got, torch.cat([rows(r) for r in range(size)]))


def check_broadcast(hvd: ModuleType, device: torch.device) -> CheckResult:
    """broadcast from the last rank (a non-zero root catches root mix-ups); input left unchanged."""
    rank, size = hvd.rank(), hvd.size()
    root = size - 1
    mine = torch.arange(17, dtype=torch.float32, device=device) * (rank + 1)
    before = mine.clone()
    got = hvd.broadcast(mine, root, name="check.broadcast")
    result = _compare(f"broadcast[root={root}]", got, torch.arange(17, dtype=torch.float32) * (root + 1))
    if result.ok and not torch.equal(mine, before):
        return CheckResult(result.name, False, "broadcast changed its input tensor (it must be out-of-place)")
    return result


def check_alltoall(hvd: ModuleType, device: torch.device) -> list[CheckResult]:
    """alltoall with equal splits, then with uneven per-rank splits (and the received splits)."""
    rank, size = hvd.rank(), hvd.size()
    # Equal: two rows per destination; a row's value says who sent it to whom.
    rows = torch.tensor([[100.0 * rank + d] for d in range(size) for _ in range(2)], device=device)
    got = hvd.alltoall(rows, name="check.alltoall")
    want = torch.tensor([[100.0 * s + rank] for s in range(size) for _ in range(2)])
    results = [_compare("alltoall[equal]", got, want)]

    def count(src: int, dst: int) -> int:
        return (src + dst) % 2 + 1

    splits = [count(rank, d) for d in range(size)]
    rows = torch.tensor([[100.0 * rank + d] for d in range(size) for _ in range(count(rank, d))],
                        device=device)
    out = hvd.alltoall(rows, splits=splits, name="check.alltoall.splits")
    want = torch.tensor([[100.0 * s + rank] for s in range(size) for _ in range(count(s, rank))])
    if not (isinstance(out, tuple) and len(out) == 2):
        results.append(CheckResult("alltoall[splits]", False,
                                   f"returned {type(out).__name__}, expected (output, received_splits)"))
        return results
    got, received = out
    result = _compare("alltoall[splits]", got, want)
    want_received = [count(s, rank) for s in range(size)]
    got_received = torch.as_tensor(received).cpu().tolist()
    if result.ok and got_received != want_received:
        result = CheckResult("alltoall[splits]", False,
                             f"received_splits {got_received}, expected {want_received}")
    results.append(result)
    return results


def check_reducescatter(hvd: ModuleType, op_name: str, device: torch.device) -> CheckResult:
    """reducescatter over 2n+1 rows: the first (rows % n) ranks get one extra row, as in Horovod."""
    rank, size = hvd.rank(), hvd.size()
    nrows = 2 * size + 1

    def contribution(r: int) -> torch.Tensor:
        return torch.arange(nrows * 2, dtype=torch.float32, device=device).reshape(nrows, 2) + r

    total = torch.stack([contribution(r) for r in range(size)]).sum(0)
    if op_name == "Average":
        total = total / size
    counts = [nrows // size + (1 if r < nrows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    got = hvd.reducescatter(contribution(rank), name=f"check.reducescatter.{op_name}",
                            op=getattr(hvd, op_name))
    return _compare(f"reducescatter[{op_name.lower()}]", got, total[start:start + counts[rank]])


def check_barrier(hvd: ModuleType) -> CheckResult:
    """barrier returns on every rank (a hang is caught by the command's timeout)."""
    result = hvd.barrier()
    if result is not None:
        return CheckResult("barrier", False, f"returned {result!r}, expected None")
    return CheckResult("barrier", True)


def _guarded(name: str, fn: Callable[[], CheckResult | list[CheckResult]]) -> list[CheckResult]:
    """Run one check; an exception becomes a failed result that names it."""
    try:
        result = fn()
    except Exception as exc:  # any error is a finding to report, not a crash
        return [CheckResult(name, False, f"raised {type(exc).__name__}: {exc}")]
    return result if isinstance(result, list) else [result]


def run_collective_checks(hvd: ModuleType, device: torch.device,
                          progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Every collective, in the same order on every rank; ``progress`` hears each name first."""
    plan: list[tuple[str, Callable[[], CheckResult | list[CheckResult]]]] = []
    for op in ALLREDUCE_OPS:
        plan.append((f"allreduce[{op.lower()}]", functools.partial(check_allreduce, hvd, op, device)))
    plan += [
        ("allreduce[int64]", lambda: check_allreduce_int(hvd, device)),
        ("allreduce[large]", lambda: check_allreduce_large(hvd, device)),
        ("allgather[uneven]", lambda: check_allgather(hvd, device)),
        ("broadcast", lambda: check_broadcast(hvd, device)),
        ("alltoall", lambda: check_alltoall(hvd, device)),
        ("reducescatter[sum]", lambda: check_reducescatter(hvd, "Sum", device)),
        ("reducescatter[average]", lambda: check_reducescatter(hvd, "Average", device)),
        ("barrier", lambda: check_barrier(hvd)),
    ]
    results: list[CheckResult] = []
    for name, fn in plan:
        if progress is not None:
            progress(name)
        results.extend(_guarded(name, fn))
    return results


def measure_allreduce_bandwidth(hvd: ModuleType, device: torch.device, sizes: Sequence[int],
                                iterations: int = 5) -> list[BandwidthSample]:
    """Median allreduce (Sum) time per message size after one warm-up call, as this rank saw it."""
    size = hvd.size()
    samples = []
    for nbytes in sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
        name = f"check.bandwidth.{nbytes}"
        hvd.allreduce(tensor, name=name, op=hvd.Sum)  # warm-up: buffers, connections, caches
        times = []
        for _ in range(iterations):
            hvd.barrier()
            start = time.perf_counter()
            hvd.allreduce(tensor, name=name, op=hvd.Sum)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        actual = tensor.numel() * 4
        algbw = actual / seconds / 1e6 if seconds > 0 else float("inf")
        samples.append(BandwidthSample(actual, seconds, algbw, algbw * 2 * (size - 1) / size))
    return samples


def count_failures_everywhere(hvd: ModuleType, local_failures: int) -> int:
    """Sum of failures over all ranks, so every rank exits with the same verdict.

    If that allreduce itself breaks, only this rank's count is known; it is returned plus one so the
    broken reduction is itself counted as a failure.
    """
    try:
        total = hvd.allreduce(torch.tensor([float(local_failures)]), name="check.verdict", op=hvd.Sum)
        return int(round(float(total.sum())))
    except Exception:  # the verdict must not crash the report
        return local_failures + 1
