"""A tiny real MNIST training for the pod tests: examples/horovod_mnist.py, unchanged, on a few steps.

Run as ``ringtrain run python mnist_script.py`` (the ``horovod`` it imports is ringtrain's shim). It
trains the example's CNN for one epoch on the first 512 images of ringtrain's embedded real MNIST
subset (a few steps per rank) and tests on the 2,000 test images, then every rank prints one line::

    mnist rank R of N local L host H accuracy A digest D

A is the test accuracy averaged over the ranks (the same on every rank) and D the hash of the rank's
trained parameters: ranks of both nodes that trained together print the same A and D. Under
``ringtrain bench`` the example's own ``RINGTRAIN_BENCH`` line per rank and epoch comes before it.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "horovod_mnist.py"
#: Few steps: 512 images in batches of 32 over the ranks (4 steps each on 4 ranks).
ARGS = ["--epochs", "1", "--train-samples", "512", "--batch-size", "32", "--test-batch-size", "500",
        "--log-interval", "1000", "--no-cuda"]


def main() -> int:
    from ringtrain.bench import parameters_digest
    from ringtrain.workloads.mnist import EMBEDDED_MNIST

    spec = importlib.util.spec_from_file_location("horovod_mnist", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    models = []
    net = example.Net

    def kept_net():  # the example's model, kept to hash what it trained
        models.append(net())
        return models[-1]

    example.Net = kept_net
    accuracy = example.main(example.parse_args([*ARGS, "--data-dir", str(EMBEDDED_MNIST)]))
    hvd = example.hvd
    # one write per line: the launcher's forwarding must not interleave another rank's line
    digest = parameters_digest(models[-1])
    sys.stdout.write(f"mnist rank {hvd.rank()} of {hvd.size()} local {hvd.local_rank()} host "
                     f"{socket.gethostname()} accuracy {accuracy:.6f} digest {digest}\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
