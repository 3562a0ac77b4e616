"""A stand-in training script for ``ringtrain bench`` tests: reports items through the hook, fast.

``--fail-at N``: exit 1 when the job has N processes (a size that breaks).
``--hang-at N``: sleep forever at N processes (a run that never ends).
``--rank0-only``: only rank 0 reports (as Horovod-style scripts print on rank 0).
No torch: the tests time nothing, they check what the sweep makes of the reports.
"""

import argparse
import os
import sys
import time

import ringtrain.bench

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int)
parser.add_argument("--hang-at", type=int)
parser.add_argument("--rank0-only", action="store_true")
parser.add_argument("--items", type=int, default=1000)
args = parser.parse_args()
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if args.fail_at == world:
    print(f"report_items: error: this script refuses {world} processes", file=sys.stderr, flush=True)
    sys.exit(1)
if args.hang_at == world:
    time.sleep(3600)
start = time.perf_counter()
time.sleep(0.05)
if rank == 0 or not args.rank0_only:
    ringtrain.bench.report(items=args.items, seconds=time.perf_counter() - start, steps=10,
                           gradient_bytes=4 << 20, threads=1, cores=os.cpu_count())
