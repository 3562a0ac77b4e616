"""``horovod.common.process_sets``: the very module ``ringtrain.process_sets`` (aliased, not copied)."""

import sys

import ringtrain.process_sets

sys.modules[__name__] = ringtrain.process_sets
