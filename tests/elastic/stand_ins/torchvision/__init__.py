"""A stand-in for the two parts of torchvision that Horovod's elastic MNIST example uses.

torchvision's wheels do not import with this machine's CPU build of torch, and the example must run
unmodified (tests/elastic/test_horovod_example.py). Only ``datasets.MNIST`` (read from the idx files
in ``<root>/MNIST/raw``, never downloaded) and ``transforms.Compose / ToTensor / Normalize`` exist.
``RINGTRAIN_TEST_MNIST_LIMIT`` keeps the first N training images, so a test runs in seconds.
"""

from torchvision import datasets, transforms

__all__ = ["datasets", "transforms"]
