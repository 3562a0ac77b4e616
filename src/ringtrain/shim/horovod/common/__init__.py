"""``horovod.common``: framework-independent pieces, served by ringtrain."""
