"""A tiny unmodified Horovod script: it knows nothing about ringtrain."""

import json
import os
import sys

import horovod
import horovod.torch as hvd
import torch

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(hvd.rank())  # ranks start different on purpose
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.5)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
total = hvd.allreduce(torch.tensor(float(hvd.rank() + 1)), name="total", op=hvd.Sum)
for step in range(3):
    opt.zero_grad()
    x = torch.full((2, 4), float(hvd.rank() + step))
    model(x).pow(2).mean().backward()
    opt.step()
out = {"rank": hvd.rank(), "size": hvd.size(), "total": total.item(), "horovod": horovod.__file__,
       "weight": model.weight.detach().flatten().tolist()}
# written atomically, like every file a test reads from a rank: never seen half-written
final = os.path.join(sys.argv[1], f"rank{hvd.rank()}.json")
with open(final + ".tmp", "w") as f:
    json.dump(out, f)
os.replace(final + ".tmp", final)
hvd.shutdown()
