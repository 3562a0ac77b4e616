"""``horovod.torch.optimizer``: the very module ``ringtrain.optimizer`` (aliased, not copied)."""

import sys

import ringtrain.optimizer

sys.modules[__name__] = ringtrain.optimizer
