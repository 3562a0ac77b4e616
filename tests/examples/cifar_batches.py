"""Write a small CIFAR-10 in the real python pickle layout (``cifar-10-batches-py``).

CIFAR-10 cannot be downloaded here, so the tests build a few hundred images in exactly the layout
of the published archive: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, each a pickled dict
with ``b'data'`` (uint8, N x 3072, the red, green and blue 32x32 planes in a row) and ``b'labels'``
(a list of ints), plus ``batches.meta``. Every class is a fixed colour template plus noise, so a
model can learn it in a few steps and a test can see the loss fall.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

LABEL_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship",
               b"truck"]


def _images(rng: np.random.Generator, templates: np.ndarray, count: int) -> tuple[np.ndarray, list[int]]:
    labels = rng.integers(0, len(templates), size=count)
    noise = rng.normal(0.0, 40.0, size=(count, 3072))
    data = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
    return data, [int(label) for label in labels]


def _dump(path: Path, batch_label: bytes, data: np.ndarray, labels: list[int]) -> None:
    record = {
        b"batch_label": batch_label,
        b"labels": labels,
        b"data": data,
        b"filenames": [f"image_{i:05d}.png".encode() for i in range(len(labels))],
    }
    with open(path, "wb") as handle:
        pickle.dump(record, handle, protocol=2)


def write_cifar10(root: Path, per_batch: int = 32, test_size: int = 64, seed: int = 0) -> Path:
    """Create ``root/cifar-10-batches-py`` with 5 x ``per_batch`` training and ``test_size`` test images."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Smooth per-class templates: a 4x4 grid of colours scaled up, far apart from one another.
    coarse = rng.uniform(30, 225, size=(10, 3, 4, 4))
    templates = np.kron(coarse, np.ones((8, 8))).reshape(10, 3072)
    for index in range(1, 6):
        data, labels = _images(rng, templates, per_batch)
        _dump(folder / f"data_batch_{index}", f"training batch {index} of 5".encode(), data, labels)
    data, labels = _images(rng, templates, test_size)
    _dump(folder / "test_batch", b"testing batch 1 of 1", data, labels)
    meta = {b"num_cases_per_batch": per_batch, b"label_names": LABEL_NAMES, b"num_vis": 3072}
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump(meta, handle, protocol=2)
    return folder
