"""``horovod.torch.functions``: the very module ``ringtrain.functions`` (aliased, not copied)."""

import sys

import ringtrain.functions

sys.modules[__name__] = ringtrain.functions
