"""Small real files in the published layouts, and a local HTTP server, for the workloads tests."""

from __future__ import annotations

import functools
import http.server
import pickle
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
"""The team's offline copies of the real datasets (absent on some machines: tests then skip)."""


def write_cifar_batch(path: Path, images: np.ndarray, labels: list[int], protocol: int = 2) -> None:
    """A batch in the layout of cifar-10-batches-py: dict with b'data' N x 3072 uint8 and b'labels'."""
    record = {
        b"batch_label": b"training batch 1 of 5",
        b"labels": labels,
        b"data": images.reshape(len(images), 3072),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }
    path.write_bytes(pickle.dumps(record, protocol=protocol))


def write_cifar10(root: Path, per_batch: int = 8, test_items: int = 6, seed: int = 0) -> Path:
    """``root/cifar-10-batches-py`` with five training batches and a test batch of random images."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name, count in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [("test_batch", test_items)]:
        images = rng.integers(0, 256, size=(count, 3, 32, 32), dtype=np.uint8)
        write_cifar_batch(folder / name, images, [int(x) for x in rng.integers(0, 10, size=count)])
    return folder


def write_ratings(path: Path, rows: list[tuple[int, int, float]], newline: str = "\r\n") -> Path:
    """A MovieLens-style ratings.csv (header userId,movieId,rating,timestamp)."""
    lines = ["userId,movieId,rating,timestamp"] + [f"{u},{m},{r},964982703" for u, m, r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write(newline.join(lines) + newline)
    return path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:  # the base signature
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()


@contextmanager
def serve_folder(folder: Path, requests: list[str] | None = None) -> Iterator[str]:
    """Serve ``folder`` over HTTP on 127.0.0.1; yields the base URL ending in '/'.

    The path of every GET is appended to ``requests`` when given.
    """
    handler_class = type("Handler", (_QuietHandler,), {"requests": [] if requests is None else requests})
    handler = functools.partial(handler_class, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
