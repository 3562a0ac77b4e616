"""Snapshots: everything needed to resume a run, written atomically, found again on start.

A snapshot is one file ``snapshot-<step>.pt`` in the snapshot folder. It is written to a hidden
temporary file in the same folder, flushed and fsynced, then renamed over its final name and the
folder fsynced: a reader sees either the previous complete set of files or the new one, never a
half-written snapshot, even if the writer is killed. Loading uses ``torch.load(weights_only=True)``
(no arbitrary unpickling), so every value inside is a tensor or a plain type.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ringtrain.exceptions import SnapshotError

log = logging.getLogger(__name__)

FORMAT = "ringtrain-snapshot-1"
_NAME = re.compile(r"^snapshot-(\d{9,})\.pt$")
_TEMP_PREFIX = ".snapshot-"


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the parameter and buffer names, shapes and dtypes: same architecture, same hash."""
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
    return digest.hexdigest()[:16]


def snapshot_name(step: int) -> str:
    """The file name of the snapshot taken after optimizer step ``step``."""
    return f"snapshot-{step:09d}.pt"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders; the rename is still atomic there
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class SnapshotManager:
    """Writes, lists, loads and prunes the snapshots of one folder.

    The public methods check and delegate to ``_write_temp`` / ``_commit`` / ``_read`` so that a
    subclass (or a test) can change how bytes reach the disk without touching the guarantees.
    """

    def __init__(self, folder: str | os.PathLike[str], keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last} must be at least 1. HINT: use keep_last=3.")
        self.folder = Path(folder)
        self.keep_last = keep_last

    # --- writing ----------------------------------------------------------------------------

    def save(self, payload: Mapping[str, Any], step: int) -> Path:
        """Write ``payload`` as the snapshot of ``step`` atomically, prune old ones; returns its path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        final = self.folder / snapshot_name(step)
        body = {"format": FORMAT, **payload}
        temp = self._write_temp(body, final)
        try:
            self._commit(temp, final)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self.prune()
        return final

    def _write_temp(self, body: Mapping[str, Any], final: Path) -> Path:
        temp = final.with_name(f"{_TEMP_PREFIX}{final.stem}.{os.getpid()}.tmp")
        try:
            with open(temp, "wb") as fp:
                torch.save(dict(body), fp)
                fp.flush()
                os.fsync(fp.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp

    def _commit(self, temp: Path, final: Path) -> None:
        os.replace(temp, final)
        _fsync_dir(final.parent)

    def prune(self) -> list[Path]:
        """Delete all but the ``keep_last`` newest snapshots; a deletion that fails is only logged."""
        removed = []
        for path in self.list()[:-self.keep_last]:
            try:
                path.unlink()
                removed.append(path)
            except OSError as exc:
                log.warning("could not delete old snapshot %s: %s", path, exc)
        return removed

    def remove_stale_temporaries(self) -> None:
        """Delete temporary files left by writers that died mid-write (call once, on rank 0)."""
        if not self.folder.is_dir():
            return
        for path in self.folder.glob(f"{_TEMP_PREFIX}*.tmp"):
            try:
                path.unlink()
            except OSError:
                pass

    # --- reading ----------------------------------------------------------------------------

    def list(self) -> list[Path]:
        """The committed snapshots, oldest first (temporary files are never listed)."""
        if not self.folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _NAME.match(p.name))]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The newest committed snapshot, or None."""
        found = self.list()
        return found[-1] if found else None

    def load(self, path: str | os.PathLike[str], fingerprint: str | None = None) -> dict[str, Any]:
        """Read a snapshot; raises SnapshotError (naming the file and the fix) when it cannot be resumed."""
        path = Path(path)
        body = self._read(path)
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise SnapshotError(f"{path} is not a ringtrain snapshot (no '{FORMAT}' marker). HINT: point "
                                "--snapshot-dir at a folder of ringtrain snapshots, or move this file away.")
        if fingerprint is not None and body.get("fingerprint") != fingerprint:
            raise SnapshotError(
                f"{path} was written for a different model (fingerprint {body.get('fingerprint')}, this "
                f"model has {fingerprint}): its weights cannot be loaded. HINT: use another --snapshot-dir "
                "for this model, or delete the old snapshots to start afresh.")
        return body

    def _read(self, path: Path) -> Any:
        hint = (f"HINT: delete {path} to resume from the previous snapshot (or start afresh if it is the "
                "only one).")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise SnapshotError(f"{path} does not exist. HINT: check --snapshot-dir.") from None
        except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SnapshotError(f"{path} is damaged or truncated and cannot be read ({reason}). "
                                f"{hint}") from None
        except Exception as exc:  # weights_only refuses foreign pickles with UnpicklingError
            raise SnapshotError(f"{path} is damaged, truncated or not a snapshot that loads safely with "
                                f"weights_only=True ({type(exc).__name__}). {hint}") from None
