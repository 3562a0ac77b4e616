"""Every collective on every dtype, on CPU and CUDA tensors, through the engine at one and two ranks.

On CUDA: NCCL at size 1 and with a GPU per rank; host memory (the CPU paths) for two ranks that share
a GPU, which NCCL refuses. Also fusion buffers on the rank's own device, fp16/bf16 compression, a
joined rank serving allreduces on its GPU, and results read on another CUDA stream.
"""

from __future__ import annotations

import torch

import ringtrain as hvd
from ringtrain import check
from ringtrain.engine import state
from tests.engine.hvd_env import fresh
from tests.gpu.placements import Placement, mismatch, rank_device

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
          torch.int32, torch.int64, torch.bool]
NUMERIC_OPS = ("Sum", "Average", "Min", "Max", "Product")
BOOL_OPS = ("Sum", "Min", "Max")


def contribution(rank: int, dtype: torch.dtype, n: int = 11) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (exact in every dtype, products fit int8)."""
    if dtype == torch.bool:
        return (torch.arange(n) + rank) % 3 == 0
    return ((torch.arange(n) % 4) + rank + 1).to(dtype)


def expected_allreduce(dtype: torch.dtype, op: str, size: int) -> torch.Tensor:
    """What every rank must get, computed from every rank's contribution in float64."""
    parts = torch.stack([contribution(r, dtype).to(torch.float64) for r in range(size)])
    if op in ("Sum", "Average"):
        total = parts.sum(0)
    elif op == "Min":
        total = parts.min(0).values
    elif op == "Max":
        total = parts.max(0).values
    else:
        total = parts.prod(0)
    if dtype == torch.bool:
        return total != 0
    if op == "Average":
        total = total / size
        if not dtype.is_floating_point:
            total = total.trunc()  # Horovod's integer average truncates toward zero
    return total.to(dtype)


def _allreduces(device: torch.device, rank: int, size: int) -> list[str | None]:
    problems = []
    for dtype in DTYPES:
        for op in BOOL_OPS if dtype == torch.bool else NUMERIC_OPS:
            name = f"allreduce[{dtype}, {op}]"
            mine = contribution(rank, dtype).to(device)
            before = mine.clone()
            got = hvd.allreduce(mine, name=name, op=getattr(hvd, op))
            problems.append(mismatch(name, got, expected_allreduce(dtype, op, size)))
            problems.append(None if got.device == device else f"{name}: result on {got.device}, not {device}")
            problems.append(mismatch(f"{name} left its input alone", mine, before))
        # in place, the same storage
        inplace = contribution(rank, dtype).to(device)
        pointer = inplace.data_ptr()
        hvd.allreduce_(inplace, name=f"allreduce_[{dtype}]", op=hvd.Max)
        problems.append(mismatch(f"allreduce_[{dtype}]", inplace, expected_allreduce(dtype, "Max", size)))
        problems.append(None if inplace.data_ptr() == pointer else f"allreduce_[{dtype}] moved the tensor")
    return problems


def _moves(device: torch.device, rank: int, size: int) -> list[str | None]:
    """allgather (uneven), broadcast (out of place and in place), alltoall, reducescatter."""
    problems = []
    root = size - 1
    for dtype in DTYPES:
        value = (lambda r: r % 2 == 0) if dtype == torch.bool else (lambda r: r + 1)
        rows = torch.full((rank + 1, 2), value(rank), dtype=dtype, device=device)
        want = torch.cat([torch.full((r + 1, 2), value(r), dtype=dtype) for r in range(size)])
        problems.append(mismatch(f"allgather[{dtype}]", hvd.allgather(rows, name=f"ag[{dtype}]"), want))
        mine = contribution(rank, dtype).to(device)
        got = hvd.broadcast(mine, root, name=f"bc[{dtype}]")
        problems.append(mismatch(f"broadcast[{dtype}]", got, contribution(root, dtype)))
        problems.append(None if got.device == device else f"broadcast[{dtype}] result on {got.device}")
        hvd.broadcast_(mine, root, name=f"bc_[{dtype}]")
        problems.append(mismatch(f"broadcast_[{dtype}]", mine, contribution(root, dtype)))
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
        # rank r sends d + 1 rows of 10 r + d to rank d
        send = torch.cat([torch.full((d + 1, 3), 10 * rank + d) for d in range(size)]).to(dtype).to(device)
        splits = torch.tensor([d + 1 for d in range(size)], dtype=torch.int32)
        got, received = hvd.alltoall(send, splits, name=f"a2a[{dtype}]")
        want = torch.cat([torch.full((rank + 1, 3), 10 * s + rank) for s in range(size)]).to(dtype)
        problems.append(mismatch(f"alltoall[{dtype}]", got, want))
        problems.append(None if received.tolist() == [rank + 1] * size else f"alltoall splits {received}")
    rows = 2 * size + 1
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        for op in ("Sum", "Average"):
            got = hvd.reducescatter(_table(rank, rows, dtype).to(device), name=f"rs[{dtype}, {op}]",
                                    op=getattr(hvd, op))
            total = sum(_table(r, rows, torch.float64) for r in range(size))
            if op == "Average":
                total = total / size if dtype.is_floating_point else (total / size).trunc()
            start = sum(rows // size + (1 if i < rows % size else 0) for i in range(rank))
            count = rows // size + (1 if rank < rows % size else 0)
            want = total[start:start + count].to(dtype)
            problems.append(mismatch(f"reducescatter[{dtype}, {op}]", got, want))
    return problems


def _table(rank: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s reducescatter input: ``rows`` x 3 small integers."""
    return (torch.arange(rows * 3).reshape(rows, 3) % 5 + rank).to(dtype)


def _every_collective(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank, size = hvd.rank(), hvd.size()
        problems = _allreduces(device, rank, size) + _moves(device, rank, size)
        # ringtrain check's own checks (Adasum, the large allreduce path, ...) on this device
        for result in check.run_collective_checks(hvd, device, lambda name: None):
            if not result.ok and not result.skipped:
                problems.append(f"check {result.name}: {result.detail}")
        return {"problems": [p for p in problems if p], "device": str(device),
                "shares_gpu": state.require().sets[0].extra.get("shares_gpu")}
    finally:
        hvd.shutdown()


def test_every_collective_on_every_dtype(placement: Placement) -> None:
    results = placement.pool.run(_every_collective, placement.kind, timeout=600)
    for rank, result in enumerate(results):
        assert result["problems"] == [], f"rank {rank} on {result['device']}"
    if placement.kind == "cuda":
        # NCCL is used unless two ranks share a GPU: then the engine stages through host memory
        assert [r["shares_gpu"] for r in results] == [placement.shared_gpu] * placement.size
        assert all(r["device"].startswith("cuda:") for r in results)
        if placement.shared_gpu or placement.size == 1:
            assert {r["device"] for r in results} == {results[0]["device"]}
        else:
            assert len({r["device"] for r in results}) == placement.size  # a GPU each
    else:
        assert all(r["shares_gpu"] is None for r in results)  # never asked: no CUDA tensor went by


def _fused(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank, size = hvd.rank(), hvd.size()
        tensors = [torch.full((n,), float(rank + 1), device=device) for n in (5, 300, 7)]
        halves = [t.to(torch.float16) for t in tensors]
        got = hvd.grouped_allreduce(tensors, name="fused32", op=hvd.Sum)
        got16 = hvd.grouped_allreduce(halves, name="fused16", op=hvd.Average)
        total = float(sum(range(1, size + 1)))
        problems = [mismatch(f"fused32[{i}]", g, torch.full((t.numel(),), total)) for i, (g, t) in
                    enumerate(zip(got, tensors))]
        problems += [mismatch(f"fused16[{i}]", g, torch.full((t.numel(),), total / size, dtype=torch.float16))
                     for i, (g, t) in enumerate(zip(got16, halves))]
        buffers = sorted((str(dtype), str(where)) for dtype, where in state.require().sets[0].buffers)
        return {"problems": [p for p in problems if p], "buffers": buffers, "device": str(device)}
    finally:
        hvd.shutdown()


def test_fusion_buffers_live_on_the_ranks_own_device(placement: Placement) -> None:
    results = placement.pool.run(_fused, placement.kind)
    for result in results:
        assert result["problems"] == []
        device = result["device"]
        assert result["buffers"] == [("torch.float16", device), ("torch.float32", device)]


def _compressed(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank, size = hvd.rank(), hvd.size()
        gen = torch.Generator().manual_seed(7)
        values = [torch.randn(1000, generator=gen) for _ in range(size)]
        want = torch.stack(values).mean(0)
        problems = []
        for name in ("fp16", "bf16"):
            compression = getattr(hvd.Compression, name)
            got = hvd.allreduce(values[rank].to(device), name=f"c.{name}", compression=compression)
            grouped = hvd.grouped_allreduce([values[rank].to(device)], name=f"cg.{name}",
                                            compression=compression)[0]
            tolerance = 2e-3 if name == "fp16" else 2e-2
            for label, result in ((name, got), (f"grouped {name}", grouped)):
                problems.append(mismatch(label, result, want, atol=tolerance, rtol=tolerance))
                if result.device != device:
                    problems.append(f"{label}: result on {result.device}, not {device}")
        return {"problems": [p for p in problems if p]}
    finally:
        hvd.shutdown()


def test_fp16_and_bf16_compression_return_the_original_dtype_on_the_device(placement: Placement) -> None:
    for result in placement.pool.run(_compressed, placement.kind):
        assert result["problems"] == []


def _joined(kind: str) -> dict:
    fresh()
    try:
        device = rank_device(kind)
        rank = hvd.rank()
        if rank == 1:
            return {"last": hvd.join()}
        sums = []
        for step in range(3):  # the response cache serves repeats
            t = torch.full((4,), float(step + 1), device=device)
            sums.append(hvd.allreduce(t, name="joined.sum", op=hvd.Sum).cpu().tolist())
        fused = hvd.grouped_allreduce([torch.ones(3, device=device), torch.ones(2, device=device)],
                                      name="joined.group", op=hvd.Sum)
        return {"sums": sums, "fused": [f.cpu().tolist() for f in fused], "last": hvd.join()}
    finally:
        hvd.shutdown()


def test_a_joined_rank_serves_allreduces_with_zeros_on_its_device(pair: Placement) -> None:
    first, second = pair.pool.run(_joined, pair.kind)
    assert first["sums"] == [[1.0] * 4, [2.0] * 4, [3.0] * 4]  # rank 1 adds zeros
    assert first["fused"] == [[1.0] * 3, [1.0] * 2]
    assert first["last"] == second["last"] == 0


def _read_on_another_stream() -> dict:
    fresh()
    try:
        device = rank_device("cuda")
        rank, size = hvd.rank(), hvd.size()
        side = torch.cuda.Stream(device)
        problems = []
        with torch.cuda.stream(side):
            for step in range(5):
                # made on the side stream: the engine must wait for it (the event recorded at submit)
                big = torch.full((8 << 20,), float(rank + step), device=device)
                handle = hvd.allreduce_async(big, name="stream.avg", op=hvd.Average, postscale_factor=3.0)
                while not hvd.poll(handle):
                    pass  # the engine's thread runs it on its own stream (this thread does not drive)
                got = hvd.synchronize(handle)
                # read on the side stream at once: the handle must mean "finished on the device"
                seen = got[::4096].clone()
                want = 3.0 * (sum(range(size)) / size + step)
                problems.append(mismatch(f"step {step}", seen, torch.full_like(seen, want).cpu()))
        torch.cuda.synchronize(device)
        return {"problems": [p for p in problems if p]}
    finally:
        hvd.shutdown()


def test_results_are_complete_on_any_stream(cuda_placement: Placement) -> None:
    for result in cuda_placement.pool.run(_read_on_another_stream):
        assert result["problems"] == []
