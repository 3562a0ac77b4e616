"""A training loop whose rank 1 does 40 ms more work per step than the others.

    slow_rank.py STEPS ddp|hvd      torch DDP, or the Horovod API's DistributedOptimizer
"""

import sys
import time

import torch

steps, api = int(sys.argv[1]), sys.argv[2]
model = torch.nn.Linear(10, 1)
if api == "hvd":
    import ringtrain as hvd

    hvd.init()
    rank = hvd.rank()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
else:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    if rank == 1:
        time.sleep(0.04)  # the slow rank's extra work
    opt.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
print("finished", rank)
