"""``horovod.runner.common``."""
