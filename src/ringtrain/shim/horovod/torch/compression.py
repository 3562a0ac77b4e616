"""``horovod.torch.compression``: the very module ``ringtrain.compression`` (aliased, not copied)."""

import sys

import ringtrain.compression

sys.modules[__name__] = ringtrain.compression
