"""``horovod.runner.util``."""
