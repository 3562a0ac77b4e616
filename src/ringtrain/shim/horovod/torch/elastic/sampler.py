"""``horovod.torch.elastic.sampler``: the very module ``ringtrain.elastic.sampler`` (aliased, not copied)."""

import sys

import ringtrain.elastic.sampler

sys.modules[__name__] = ringtrain.elastic.sampler
