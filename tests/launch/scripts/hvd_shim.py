"""An unmodified Horovod script: it must run under ringtrain run through the horovod shim."""

import os
import sys

import horovod.torch as hvd
import torch

hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
with open(os.path.join(sys.argv[1], f"{hvd.rank()}.txt"), "w") as fp:
    fp.write(f"{hvd.rank()} {hvd.size()} {hvd.local_rank()} {total.item()}")
hvd.shutdown()
