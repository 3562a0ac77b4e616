"""``horovod.torch.elastic.state``: the very module ``ringtrain.elastic.state`` (aliased, not copied)."""

import sys

import ringtrain.elastic.state

sys.modules[__name__] = ringtrain.elastic.state
