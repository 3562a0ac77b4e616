"""Worker side of ``ringtrain.run(func)``: load the pickled call, run it, store this rank's result."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle


def main(folder: str) -> int:
    """Run ``func(*args, **kwargs)`` from ``folder/call.pkl``; write ``folder/result.<rank>.pkl``."""
    path = Path(folder)
    with open(path / "call.pkl", "rb") as fp:
        func, args, kwargs = cloudpickle.load(fp)
    result = func(*args, **kwargs)
    rank = os.environ.get("RANK", "0")
    tmp = path / f".result.{rank}.tmp"
    with open(tmp, "wb") as fp:
        cloudpickle.dump(result, fp)
    os.replace(tmp, path / f"result.{rank}.pkl")  # atomic: a half-written result is never read
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
