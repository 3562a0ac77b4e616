"""``horovod.common.exceptions``: the very module ``ringtrain.exceptions`` (aliased, not copied)."""

import sys

import ringtrain.exceptions

sys.modules[__name__] = ringtrain.exceptions
