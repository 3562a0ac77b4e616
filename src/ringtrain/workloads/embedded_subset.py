"""How the embedded MNIST subset is made: the first images of the real files, re-written as IDX .gz.

Run ``python -m ringtrain.workloads.embedded_subset SRC`` with SRC the folder of the four original
MNIST files to rebuild ``embedded/mnist`` (the output is byte-for-byte reproducible).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ringtrain.workloads.idx import read_idx, write_idx
from ringtrain.workloads.mnist import EMBEDDED_MNIST, SPLIT_FILES

TRAIN_ITEMS = 10_000
"""The first 10,000 images (and labels) of ``train-images-idx3-ubyte``."""
TEST_ITEMS = 2_000
"""The first 2,000 images (and labels) of ``t10k-images-idx3-ubyte``."""


def write_subset(src: Path, dst: Path, train_items: int = TRAIN_ITEMS, test_items: int = TEST_ITEMS) -> None:
    """Write the first ``train_items`` / ``test_items`` of the MNIST files in ``src`` to ``dst`` (IDX .gz)."""
    dst.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train_items), ("test", test_items)):
        for name in SPLIT_FILES[split]:
            original = src / f"{name}.gz"
            if not original.is_file():
                original = src / name
            data = read_idx(original)[:count].numpy()
            write_idx(dst / f"{name}.gz", data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m ringtrain.workloads.embedded_subset MNIST_FOLDER")
    write_subset(Path(sys.argv[1]), EMBEDDED_MNIST)
