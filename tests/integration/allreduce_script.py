"""A minimal ringtrain job for scheduler tests: each rank allreduces its rank and prints what it saw.

Run under a launcher (``srun``, ``mpirun``, ``ringtrain run``); prints one line per rank:
``rank R of N local L env E sum S host H`` where S must be 0+1+...+(N-1) and H is the rank's host name.
"""

from __future__ import annotations

import socket
import sys

import torch


def main() -> int:
    from ringtrain import check
    from ringtrain.env import detect_environment

    torch.set_num_threads(1)
    placement = detect_environment().placement()
    hvd = check.load_api()
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), name="script.sum", op=hvd.Sum)
    # One write per line: print() writes the text and the newline separately, and the launcher's
    # forwarding can interleave another rank's line in between.
    line = f"rank {hvd.rank()} of {hvd.size()} local {hvd.local_rank()} env {placement.environment}"
    sys.stdout.write(f"{line} sum {int(total.item())} host {socket.gethostname()}\n")
    sys.stdout.flush()
    size = hvd.size()
    hvd.shutdown()
    return 0 if int(total.item()) == size * (size - 1) // 2 else 1


if __name__ == "__main__":
    sys.exit(main())
