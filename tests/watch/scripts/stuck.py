"""A training loop whose rank 1 gets stuck at step 5 in the way argv[1] names.

block     rank 1 waits forever in Python (a lock nobody releases)
mismatch  rank 1 calls a broadcast that the other ranks do not
stop      rank 1 stops itself with SIGSTOP
hvd       as block, in a Horovod-API script (DistributedOptimizer)
"""

import os
import signal
import sys
import threading

import torch

MODE = sys.argv[1]


def get_stuck(rank: int) -> None:
    if rank != 1:
        return
    if MODE in ("block", "hvd"):
        threading.Event().wait()  # the stuck line
    elif MODE == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif MODE == "mismatch":
        import torch.distributed as dist

        dist.broadcast(torch.zeros(11), src=1)


if MODE == "hvd":
    import ringtrain as hvd

    hvd.init()
    rank = hvd.rank()
    model = torch.nn.Linear(10, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
else:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    if step == 5:
        get_stuck(rank)
    opt.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
print("finished", rank)
