"""A DDP training loop whose rank 1 does 40 ms more work per step than the others (argv[1] steps)."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(sys.argv[1])):
    if rank == 1:
        time.sleep(0.04)  # the slow rank's extra work
    opt.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
print("finished", rank)
