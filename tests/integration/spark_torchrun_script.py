"""An unmodified Horovod-API script for torchrun, as ``TorchDistributor`` starts it: ``import
horovod.torch as hvd`` (ringtrain's shim on the executors' PYTHONPATH), ``hvd.init()`` from torchrun's
variables, one allreduce. Each rank writes ``rank<R>.json`` into the folder given as its argument (the
namespace hosts share this machine's file system), since TorchDistributor returns nothing of a script.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import horovod.torch as hvd
import torch


def main(folder: Path) -> int:
    torch.set_num_threads(1)
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), name="spark.sum", op=hvd.Sum)
    from ringtrain.env import detect_environment

    record = {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "sum": float(total),
              "host": socket.gethostname(), "environment": detect_environment().name,
              "authenticated": bool(os.environ.get("RINGTRAIN_JOB_SECRET"))}
    (folder / f"rank{hvd.rank()}.json").write_text(json.dumps(record))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
