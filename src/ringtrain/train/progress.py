"""A progress bar on rank 0 only, and only where someone watches a terminal."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """Wraps tqdm; every method is a no-op when disabled (other ranks, pipes, ``progress=False``)."""

    def __init__(self, enabled: bool, total: int, description: str, initial: int = 0) -> None:
        self._bar: Any = None
        if enabled and sys.stdout.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=description, leave=False, dynamic_ncols=True,
                             file=sys.stdout)

    def update(self, n: int = 1, **postfix: float) -> None:
        """Advance by ``n`` batches and show the given numbers."""
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: f"{v:.4f}" for k, v in postfix.items()}, refresh=False)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
