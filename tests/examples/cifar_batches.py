"""Write a small CIFAR-10 in the real python pickle layout (``cifar-10-batches-py``).

CIFAR-10 cannot be downloaded here, so the tests build a few hundred images in exactly the layout
of the published archive: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, each a pickled dict
with ``b'data'`` (uint8, N x 3072, the red, green and blue 32x32 planes in a row) and ``b'labels'``
(a list of ints), plus ``batches.meta``. Every class is a fixed colour template plus noise, so a
model can learn it in a few steps and a test can see the loss fall.

The published files were written by Python 2's cPickle (protocol 2), where every byte string is a
``BINSTRING``; Python 3 would write ``_codecs.encode`` calls instead, which no genuine batch holds.
So the byte strings are written the Python 2 way here.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np

LABEL_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship",
               b"truck"]


class _Python2Pickler(pickle._Pickler):
    """Protocol 2 with byte strings as ``SHORT_BINSTRING`` / ``BINSTRING``, as Python 2 wrote ``str``."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_bytes_as_str(self, obj: bytes) -> None:
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_bytes_as_str


def _pickle(obj: object, path: Path) -> None:
    with open(path, "wb") as handle:
        _Python2Pickler(handle, protocol=2).dump(obj)


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
    _pickle(record, path)


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
    _pickle(meta, folder / "batches.meta")
    return folder
