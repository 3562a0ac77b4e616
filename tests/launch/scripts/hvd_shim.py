"""An unmodified Horovod script: it must run under ringtrain run through the horovod shim."""

import os
import sys

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
# written atomically, like every file a test reads from a rank: never seen half-written
final = os.path.join(sys.argv[1], f"{hvd.rank()}.txt")
with open(final + ".tmp", "w") as fp:
    fp.write(f"{hvd.rank()} {hvd.size()} {hvd.local_rank()} {total.item()}")
os.replace(final + ".tmp", final)
hvd.shutdown()
