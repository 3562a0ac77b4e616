"""``horovod.runner.common.util.secret``: a random key, as Horovod made one per run.

Ray Train's ``HorovodConfig`` stores one as its ``key``. ringtrain does not use it: every rendezvous
opens its job store under a fresh secret of its own (``ringtrain.engine.auth``).
"""

from __future__ import annotations

import base64
import secrets

#: Random bytes in a key (before base64).
SECRET_LENGTH = 32


def make_secret_key() -> bytes:
    """``SECRET_LENGTH`` random bytes, base64-encoded."""
    return base64.b64encode(secrets.token_bytes(SECRET_LENGTH))
