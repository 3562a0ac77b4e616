"""Logging for the Trainer: one logger prefix, rank-0 helpers, and the metrics files."""

from __future__ import annotations

import csv
import logging
import sys
from pathlib import Path
from typing import Any

LOGGER_NAME = "ringtrain.train"


class _Handler(logging.StreamHandler):
    """ringtrain.train's own stderr handler (``_ringtrain`` marks it, so it is added once)."""

    _ringtrain = True


def init_logger(level: int = logging.INFO) -> logging.Logger:
    """Send ``ringtrain.train`` records to stderr as plain lines (idempotent)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_ringtrain", False) for h in logger.handlers):
        handler = _Handler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger


class RankZero:
    """Print and log only on rank 0, so the console shows each line once."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def print(self, text: str) -> None:
        """A line on stdout, from rank 0 only, flushed (the launcher forwards it at once)."""
        if self.rank == 0:
            print(text, flush=True)

    def warn(self, text: str) -> None:
        """A warning on stderr, from rank 0 only."""
        if self.rank == 0:
            logging.getLogger(LOGGER_NAME).warning(text)


class MetricsLog:
    """``metrics.csv`` plus TensorBoard scalars (when ``tensorboard`` is installed) in one folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.folder / "metrics.csv"
        self._writer: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            pass
        else:
            self._writer = SummaryWriter(log_dir=str(self.folder))

    def write(self, row: dict[str, Any]) -> None:
        """Append one epoch's row (a header first if the file is new) and the matching scalars."""
        new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        with open(self.csv_path, "a", newline="", encoding="utf-8") as fp:
            writer = csv.DictWriter(fp, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
        if self._writer is not None:
            for key, value in row.items():
                if key != "epoch" and isinstance(value, int | float) and value == value:
                    self._writer.add_scalar(key, value, int(row["epoch"]))
            self._writer.flush()

    def close(self) -> None:
        """Close the TensorBoard writer."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
