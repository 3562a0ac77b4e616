"""Hierarchical allreduce and allgather across hosts: every rank checks the results and reports its hosts.

Run under ``ringtrain run --hierarchical-allreduce --hierarchical-allgather``; prints one line per rank:
``rank R host H hosts [[...], [...]] root yes|no runs N ok``, and exits 1 on a wrong result.
"""

from __future__ import annotations

import socket
import sys

import torch


def _data(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)


def main() -> int:
    from ringtrain import check
    from ringtrain.engine import state

    torch.set_num_threads(1)
    hvd = check.load_api()
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    every = [_data(r, 200_000) for r in range(size)]
    total = hvd.allreduce(every[rank], name="h.sum", op=hvd.Sum)
    ok = torch.allclose(total, sum(every), rtol=1e-12, atol=1e-12)
    rows = hvd.allgather(torch.full((rank + 1, 3), float(rank)), name="h.gather")
    ok &= rows[:, 0].tolist() == [float(r) for r in range(size) for _ in range(r + 1)]
    adasum = hvd.allreduce(every[rank][:1000], name="h.adasum", op=hvd.Adasum)
    ok &= bool(torch.isfinite(adasum).all())
    same = hvd.allgather(adasum.view(1, -1), name="h.same")
    ok &= bool((same == same[0]).all())  # one result, bit for bit, on every rank
    hierarchy = state.require().sets[0].extra["hierarchy"]
    line = (f"rank {rank} host {socket.gethostname()} hosts {hierarchy.hosts} "
            f"root {'yes' if hierarchy.is_root else 'no'} runs {hierarchy.runs} {'ok' if ok else 'WRONG'}")
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
