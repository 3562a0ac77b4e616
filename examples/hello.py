"""Install check: every rank says hello, after one allreduce proves the ranks can talk.

Run on two local processes (either launcher works):

    ringtrain run -np 2 python examples/hello.py
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/hello.py

Each rank prints ``hello from rank R of N ...``; a single ``python examples/hello.py`` is rank 0 of 1.
"""

import socket

import torch

import ringtrain as hvd


def main() -> None:
    hvd.init()
    # Starting is not enough: the sum of all ranks only comes back right if every rank joined in.
    rank_sum = hvd.allreduce(torch.tensor(hvd.rank()), op=hvd.Sum, name="hello.rank_sum")
    expected = hvd.size() * (hvd.size() - 1) // 2
    status = "ok" if int(rank_sum) == expected else f"WRONG (expected {expected})"
    print(f"hello from rank {hvd.rank()} of {hvd.size()} "
          f"(local rank {hvd.local_rank()} of {hvd.local_size()}) on {socket.gethostname()}: "
          f"sum of ranks {int(rank_sum)} {status}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
