"""Models of the built-in workloads."""

from ringtrain.workloads.models.conv import SmallConvNet
from ringtrain.workloads.models.mnist_cnn import HorovodMnistNet, MnistCNN
from ringtrain.workloads.models.recommender import BiasedMF, NeuralCF
from ringtrain.workloads.models.resnet import ResNet, resnet18_cifar

__all__ = ["BiasedMF", "HorovodMnistNet", "MnistCNN", "NeuralCF", "ResNet", "SmallConvNet", "resnet18_cifar"]
