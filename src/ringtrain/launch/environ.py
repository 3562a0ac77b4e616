"""Temporary changes to this process's environment, which torch's agent hands to the workers it starts.

Its own module because both the node agent and the restarting agent below it set variables this way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def patched_environ(updates: Mapping[str, str]) -> Iterator[None]:
    """Set variables for the workers (they inherit this process's environment), then restore them."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
