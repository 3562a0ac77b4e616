"""``horovod.torch.sync_batch_norm``: the very module ``ringtrain.sync_batch_norm`` (aliased, not copied)."""

import sys

import ringtrain.sync_batch_norm

sys.modules[__name__] = ringtrain.sync_batch_norm
