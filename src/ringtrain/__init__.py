"""ringtrain: data-parallel training for PyTorch.

``import ringtrain as hvd`` gives Horovod's ``horovod.torch`` API, rebuilt on ``torch.distributed``.
"""

__version__ = "0.1.0"
