"""``horovod.runner.common.util``: ``secret`` and ``timeout``, the two that Ray Train imports."""
