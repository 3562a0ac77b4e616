"""Worker for console tests: rank 0 draws a tqdm bar, rank 1 prints lines (one of them in two writes).

``progress_bars.py DIR``: rank 0 stops at 50% until DIR/seen exists (the test saw the live bar),
rank 1 prints its lines only then and creates DIR/printed, and rank 0 finishes once that exists.
Without DIR nothing waits.
"""

import os
import sys
import time

from tqdm import tqdm

folder = sys.argv[1] if len(sys.argv) > 1 else None
rank = int(os.environ["RANK"])


def wait_for(name: str) -> None:
    deadline = time.monotonic() + 120
    while folder and not os.path.exists(os.path.join(folder, name)) and time.monotonic() < deadline:
        time.sleep(0.02)


if rank == 0:
    with tqdm(total=40, desc="work", mininterval=0) as bar:
        for step in range(40):
            if step == 20:
                wait_for("seen")
                wait_for("printed")
            time.sleep(0.02)
            bar.update(1)
else:
    wait_for("seen")
    for k in range(3):
        print(f"rank 1 line {k}", flush=True)
    print("part A", end="", flush=True)
    time.sleep(0.3)
    print(" part B", flush=True)
    if folder:
        open(os.path.join(folder, "printed"), "w").close()
