"""Models of the built-in workloads."""

from ringtrain.workloads.models.mnist_cnn import HorovodMnistNet, MnistCNN

__all__ = ["HorovodMnistNet", "MnistCNN"]
