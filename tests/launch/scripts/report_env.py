"""Worker for launcher tests: write this rank's environment to OUT/<RANK>.json; optionally fail or sleep.

``fail``: rank 1 raises ValueError once every rank has written its file. ``sleep``: every rank sleeps.
``stubborn``: every rank ignores the stop signals (as one stuck in a C call does), then sleeps.
"""

import glob
import json
import os
import signal
import sys
import time

out = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else ""
rank = os.environ["RANK"]
prefixes = ("HOROVOD_", "RANK", "WORLD_SIZE", "LOCAL_", "GROUP_", "MASTER_", "PYTHON", "GLOO_", "OMP_",
            "RINGTRAIN_JOB_", "TORCHELASTIC_RUN_ID")
if mode == "stubborn":
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
keys = [k for k in os.environ if k.startswith(prefixes)]
# Written atomically: the tests poll this folder and must never read a half-written file.
tmp = os.path.join(out, f".{rank}.json.tmp")
with open(tmp, "w") as fp:
    json.dump({k: os.environ[k] for k in keys} | {"pid": os.getpid(), "argv": sys.argv[1:]}, fp)
os.replace(tmp, os.path.join(out, f"{rank}.json"))
print(f"hello from rank {rank}", flush=True)
if mode == "fail" and rank == "1":
    # wait until every rank has reported: the tests then see the whole job, however slowly it started
    deadline = time.monotonic() + 120
    while len(glob.glob(os.path.join(out, "*.json"))) < int(os.environ["WORLD_SIZE"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    raise ValueError("rank one gives up")
if mode in ("sleep", "stubborn"):
    time.sleep(600)
