"""Snapshots: everything needed to resume a run, written atomically, verified and found again on start.

A snapshot is one file ``snapshot-<step>.pt`` in the snapshot folder, with its checksum beside it in
``snapshot-<step>.json`` (the SHA-256 and the size of the ``.pt`` file). The ``.pt`` file is written to
a hidden temporary file in the same folder, flushed and fsynced, and hashed; then the checksum file is
put in place (also atomically) and only then the ``.pt`` file is renamed to its final name, and the
folder fsynced. The rename is the commit: a reader sees either the previous complete set of
snapshots or the new one, never a half-written snapshot, and every committed snapshot has its
checksum, even if the writer is killed at any point.

State that differs from rank to rank (PowerSGD's error feedback, Local SGD's parameters between two
averagings) goes into one *part* per rank, ``snapshot-<step>.rank-<r>.pt``, which each rank writes,
fsyncs and hashes itself before rank 0 writes the snapshot; the snapshot's checksum file lists every
part with its size and SHA-256, so the commit covers them: a part of a snapshot that was never
committed is never read (and is removed as a leftover), and a committed snapshot whose part is
missing or short is skipped like a damaged one.

Writing is two halves, :meth:`SnapshotManager.write` (the bytes, to a temporary file, fsynced, hashed
while they are written) and :meth:`SnapshotManager.commit` (the checksum file, the rename, the prune),
so that the bytes can be written by another process while training goes on
(:mod:`ringtrain.train.background_snapshots`): what either writer leaves is the same file.

Loading checks the size and the SHA-256 before anything is unpickled, so a snapshot damaged on disk
(a flipped block, a truncated copy) is reported as :class:`DamagedSnapshotError` instead of resuming
silently with corrupted weights or optimizer state; :meth:`SnapshotManager.load_newest` then takes the
newest good snapshot. Snapshots of the earlier format (no checksum file) still load, unverified, with a
warning: refusing them would strand every run started before checksums existed, and ``torch.load``
still catches most damage to them. Loading uses ``torch.load(weights_only=True)`` (no arbitrary
unpickling), so every value inside is a tensor or a plain type.
"""

from __future__ import annotations

import builtins  # in SnapshotManager's annotations `list` is its method
import errno
import hashlib
import json
import logging
import os
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ringtrain.exceptions import DamagedSnapshotError, SnapshotError

log = logging.getLogger(__name__)

FORMAT = "ringtrain-snapshot-1"
#: What a checksum file holds (``snapshot-<step>.json`` beside ``snapshot-<step>.pt``).
CHECKSUM_FORMAT = "ringtrain-snapshot-checksum-1"
_NAME = re.compile(r"^snapshot-(\d{9,})\.pt$")
_CHECKSUM_NAME = re.compile(r"^snapshot-(\d{9,})\.json$")
_PART_NAME = re.compile(r"^snapshot-(\d{9,})\.rank-(\d{5,})\.pt$")
_TEMP_PREFIX = ".snapshot-"
_HASH_CHUNK = 4 * 1024 * 1024


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the parameter and buffer names, shapes and dtypes: same architecture, same hash."""
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
    return digest.hexdigest()[:16]


def snapshot_name(step: int) -> str:
    """The file name of the snapshot taken after optimizer step ``step``."""
    return f"snapshot-{step:09d}.pt"


def checksum_path(path: Path) -> Path:
    """The checksum file of the snapshot ``path``."""
    return path.with_suffix(".json")


def part_name(step: int, rank: int) -> str:
    """The file name of rank ``rank``'s part of the snapshot taken after step ``step``."""
    return f"snapshot-{step:09d}.rank-{rank:05d}.pt"


def part_record(path: Path) -> dict[str, Any]:
    """What the checksum file of a snapshot lists for one part written at ``path``: name, size, SHA-256."""
    return {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fp:
        while chunk := fp.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _os_reason(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the words and the symbol people search for."""
    name = errno.errorcode.get(exc.errno or 0)
    words = exc.strerror or str(exc)
    return f"{words} ({name})" if name else words


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


class _WriteErrors:
    """A binary file that hashes what goes through it (no second read of the file for its checksum) and
    remembers the OSError of a failed write: torch.save reports a full disk as a RuntimeError about the
    zip writer's position, the ENOSPC itself is lost on the way."""

    def __init__(self, fp: Any) -> None:
        self._fp = fp
        self.error: OSError | None = None
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        try:
            written = self._fp.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise
        self.sha256.update(data)  # torch hands over whole records (a storage in one call): large updates
        self.size += memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self._fp.flush()


@dataclass(frozen=True)
class Written:
    """A snapshot's bytes under a temporary name, not yet committed (:meth:`SnapshotManager.write`)."""

    temp: Path
    final: Path
    sha256: str | None
    """Its SHA-256 as hashed while writing (None: hash the file, where ``_write_temp`` was replaced)."""
    bytes: int


class SnapshotManager:
    """Writes, lists, loads and prunes the snapshots of one folder.

    The public methods check and delegate to ``_write_temp`` / ``_commit`` / ``_read`` so that a
    subclass (or a test) can change how bytes reach the disk without touching the guarantees.
    """

    #: The way out when a snapshot cannot be written (a folder user of the manager may say its own).
    write_hint = ("point --snapshot-dir (TrainerConfig.snapshot_dir) at a writable folder, then run again "
                  "to resume.")

    def __init__(self, folder: str | os.PathLike[str], keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last} must be at least 1. HINT: use keep_last=3.")
        self.folder = Path(folder)
        self.keep_last = keep_last
        self._digests: dict[Path, tuple[str, int]] = {}
        """What ``_write_temp`` hashed while writing, by temporary file, until its checksum is written."""

    # --- writing ----------------------------------------------------------------------------

    def save(self, payload: Mapping[str, Any], step: int,
             parts: builtins.list[dict[str, Any]] | None = None) -> Path:
        """Write ``payload`` as the snapshot of ``step`` atomically, prune old ones; returns its path.

        ``parts``: the records (:func:`part_record`) of the ranks' parts, in rank order, already written
        with :meth:`save_part`; the checksum file lists them, so the snapshot commits them too. A folder
        that cannot take it (full, read-only, gone) raises :class:`SnapshotError` naming it; the
        snapshots already there are left as they were.
        """
        return self.commit(self.write_snapshot(payload, step, parts=len(parts) if parts else 0), parts)

    def write_snapshot(self, payload: Mapping[str, Any], step: int, parts: int = 0) -> Written:
        """The first half of :meth:`save`: the snapshot of ``step`` (with ``parts`` parts to be listed at
        the commit) written, fsynced and hashed under a temporary name that no reader lists."""
        body = {"format": FORMAT, **payload}
        if parts:
            body["parts"] = parts
        return self.write(body, self.folder / snapshot_name(step))

    def write(self, body: Any, final: Path) -> Written:
        """Write ``body`` for ``final`` to a temporary file beside it, fsynced and hashed while written;
        :meth:`commit` puts it in place, :meth:`discard` drops it. :class:`SnapshotError` names ``final``
        and the reason when the folder cannot take it."""
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            temp = self._write_temp(body, final)
        except OSError as exc:
            raise self._cannot_write(final, exc) from exc
        digest, size = self._digests.pop(temp, (None, -1))
        return Written(temp, final, digest, size)

    def commit(self, written: Written, parts: builtins.list[dict[str, Any]] | None = None,
               prune: bool = True) -> Path:
        """The second half of :meth:`save`: the checksum file of ``written`` (listing ``parts``), the
        rename that commits it, and (``prune``) the deletion of snapshots beyond ``keep_last``."""
        final = written.final
        try:
            try:
                self._write_checksum(written.temp, final, parts, written)
                self._commit(written.temp, final)
            except BaseException:
                written.temp.unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise self._cannot_write(final, exc) from exc
        if prune:
            self.prune()
        return final

    def discard(self, written: Written) -> None:
        """Drop a written snapshot that is not to be committed (its temporary file)."""
        written.temp.unlink(missing_ok=True)

    def _cannot_write(self, final: Path, exc: OSError) -> SnapshotError:
        return SnapshotError(
            f"cannot write snapshot {final}: {_os_reason(exc)}. The snapshots already there are "
            f"intact. HINT: free space in {final.parent} or {self.write_hint}")

    def save_part(self, payload: Mapping[str, Any], step: int, rank: int) -> dict[str, Any]:
        """Write rank ``rank``'s part of the snapshot of ``step`` (fsynced, under its final name, which no
        reader looks at until the snapshot itself is committed); returns its :func:`part_record`.

        A write that fails raises :class:`SnapshotError` naming the file; nothing committed changes.
        """
        final = self.folder / part_name(step, rank)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            temp = self._write_temp({"format": FORMAT, "rank": rank, **payload}, final)
            digest, size = self._digests.pop(temp, (None, -1))
            self._commit(temp, final)
            if digest is None:
                return part_record(final)
            return {"file": final.name, "bytes": size, "sha256": digest}
        except OSError as exc:
            raise SnapshotError(
                f"rank {rank} cannot write its part {final} of snapshot {snapshot_name(step)}: "
                f"{_os_reason(exc)}. The snapshots already there are intact. HINT: free space in "
                f"{self.folder} or point --snapshot-dir (TrainerConfig.snapshot_dir) at a writable folder "
                "that every rank shares, then run again to resume.") from exc

    def check_writable(self) -> None:
        """Raise :class:`SnapshotError` naming the folder and the fix when snapshots cannot be written
        there (a file, a read-only or forbidden path): called before the first step, not at the first
        save after a whole interval of training."""
        folder = self.folder
        hint = ("HINT: point --snapshot-dir (TrainerConfig.snapshot_dir) at a folder you can write, "
                "or leave it out for no snapshots.")
        if folder.exists() and not folder.is_dir():
            raise SnapshotError(f"the snapshot folder {folder} is a file, not a folder. {hint}")
        probe = folder / f"{_TEMP_PREFIX}write-test.{os.getpid()}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(probe, "wb") as fp:
                fp.write(b"ringtrain")
                fp.flush()
                os.fsync(fp.fileno())
            probe.unlink()
        except OSError as exc:
            raise SnapshotError(f"cannot write snapshots to {folder}: {_os_reason(exc)} "
                                f"({exc.filename or folder}). {hint}") from None

    def _write_temp(self, body: Any, final: Path) -> Path:
        temp = final.with_name(f"{_TEMP_PREFIX}{final.stem}.{os.getpid()}.tmp")
        try:
            with open(temp, "wb") as fp:
                out = _WriteErrors(fp)
                try:
                    # torch's stubs ask for an IO[bytes]; torch.save only calls write and flush
                    torch.save(body, out)  # type: ignore[arg-type]
                except RuntimeError:
                    if out.error is not None:  # the disk's own error, not torch's "unexpected pos"
                        raise out.error from None
                    raise
                fp.flush()
                os.fsync(fp.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._digests[temp] = (out.sha256.hexdigest(), out.size)
        return temp

    def _write_checksum(self, temp: Path, final: Path,
                        parts: builtins.list[dict[str, Any]] | None = None,
                        written: Written | None = None) -> None:
        """Put the checksum of the written ``temp`` in place for ``final`` (before ``final`` exists), with
        the records of its ``parts``; ``written`` carries the hash taken while writing, when there is one."""
        if written is not None and written.sha256 is not None:
            size, digest = written.bytes, written.sha256
        else:
            size, digest = temp.stat().st_size, file_sha256(temp)
        record: dict[str, Any] = {"format": CHECKSUM_FORMAT, "file": final.name, "bytes": size,
                                  "sha256": digest}
        if parts:
            record["parts"] = list(parts)
        target = checksum_path(final)
        staging = target.with_name(f"{_TEMP_PREFIX}{target.name}.{os.getpid()}.tmp")
        try:
            with open(staging, "w") as fp:
                json.dump(record, fp)
                fp.flush()
                os.fsync(fp.fileno())
            os.replace(staging, target)
        except BaseException:
            staging.unlink(missing_ok=True)
            raise

    def _commit(self, temp: Path, final: Path) -> None:
        os.replace(temp, final)
        _fsync_dir(final.parent)

    def prune(self) -> list[Path]:
        """Delete all but the ``keep_last`` newest snapshots; a deletion that fails is only logged."""
        removed = []
        for path in self.list()[:-self.keep_last]:
            try:
                path.unlink()  # the snapshot first: a checksum file alone is never listed
                for part in self._parts_on_disk(path):
                    part.unlink(missing_ok=True)
                checksum_path(path).unlink(missing_ok=True)
                removed.append(path)
            except OSError as exc:
                log.warning("could not delete old snapshot %s: %s", path, exc)
        return removed

    def remove_stale_temporaries(self) -> None:
        """Delete what writers that died mid-write left (call once, on rank 0): temporary files, and
        checksum files whose snapshot was never committed."""
        if not self.folder.is_dir():
            return
        stale = list(self.folder.glob(f"{_TEMP_PREFIX}*.tmp"))
        stale += [p for p in self.folder.iterdir()
                  if _CHECKSUM_NAME.match(p.name) and not p.with_suffix(".pt").exists()]
        # the parts of a snapshot that was never committed (its writer died between parts and commit)
        stale += [p for p in self.folder.iterdir()
                  if (m := _PART_NAME.match(p.name))
                  and not (self.folder / snapshot_name(int(m[1]))).exists()]
        for path in stale:
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

    def verify(self, path: str | os.PathLike[str]) -> bool:
        """Check ``path`` against its checksum file: True when it matches, False when it has none (the
        earlier format); :class:`DamagedSnapshotError` when it does not match."""
        path = Path(path)
        hint = (f"HINT: delete {path} and {checksum_path(path).name} (an older snapshot is resumed instead "
                "when there is one; ringtrain skips a damaged one by itself).")
        try:
            record = json.loads(checksum_path(path).read_text())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            raise DamagedSnapshotError(f"{path} cannot be verified: its checksum file "
                                       f"{checksum_path(path).name} is unreadable ({exc}). {hint}") from None
        if not isinstance(record, dict) or record.get("format") != CHECKSUM_FORMAT:
            raise DamagedSnapshotError(f"{path} cannot be verified: {checksum_path(path).name} is not a "
                                       f"ringtrain checksum file. {hint}")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise SnapshotError(f"{path} does not exist. HINT: check --snapshot-dir.") from None
        if size != record.get("bytes"):
            raise DamagedSnapshotError(f"{path} is damaged: it has {size} bytes, {record.get('bytes')} were "
                                       f"written (truncated or overwritten). {hint}")
        digest = file_sha256(path)
        if digest != record.get("sha256"):
            raise DamagedSnapshotError(f"{path} is damaged: its SHA-256 is {digest[:16]}..., "
                                       f"{str(record.get('sha256'))[:16]}... was written (the file changed "
                                       f"on disk). {hint}")
        for part in record.get("parts") or []:
            # present and whole here; each rank checks the SHA-256 of the parts it reads (load_part)
            try:
                part_size = (path.parent / part["file"]).stat().st_size
            except FileNotFoundError:
                raise DamagedSnapshotError(f"{path} is incomplete: its part {part['file']} is missing. "
                                           f"{hint}") from None
            if part_size != part.get("bytes"):
                raise DamagedSnapshotError(f"{path} is damaged: its part {part['file']} has {part_size} "
                                           f"bytes, {part.get('bytes')} were written. {hint}")
        return True

    def part_records(self, path: str | os.PathLike[str]) -> builtins.list[dict[str, Any]]:
        """The parts the snapshot ``path`` lists in its checksum file, in rank order (none: [])."""
        try:
            record = json.loads(checksum_path(Path(path)).read_text())
        except (OSError, ValueError):
            return []
        parts = record.get("parts") if isinstance(record, dict) else None
        return list(parts) if isinstance(parts, list) else []

    def _parts_on_disk(self, path: Path) -> builtins.list[Path]:
        """The part files of snapshot ``path`` in its folder, listed or not."""
        step = path.name[len("snapshot-"):-len(".pt")]
        return [p for p in path.parent.glob(f"snapshot-{step}.rank-*.pt") if _PART_NAME.match(p.name)]

    def load_part(self, path: str | os.PathLike[str], rank: int) -> dict[str, Any]:
        """Rank ``rank``'s part of the committed snapshot ``path``, its SHA-256 verified first.

        :class:`DamagedSnapshotError` names the part and the fix when it is missing or damaged, and
        :class:`SnapshotError` when the snapshot has no part for that rank.
        """
        path = Path(path)
        records = self.part_records(path)
        if not 0 <= rank < len(records):
            raise SnapshotError(f"{path} has no part for rank {rank} ({len(records)} part(s) listed). "
                                "HINT: resume it with the ranks that wrote it, or delete it to resume from "
                                "an older snapshot.")
        record = records[rank]
        part = path.parent / record["file"]
        hint = (f"HINT: delete {path} and its files (snapshot-{path.stem.split('-')[1]}.*) to resume from "
                "the previous snapshot.")
        try:
            digest = file_sha256(part)
        except FileNotFoundError:
            raise DamagedSnapshotError(f"{path} is incomplete: its part {part.name} is missing. "
                                       f"{hint}") from None
        if digest != record.get("sha256") or part.stat().st_size != record.get("bytes"):
            raise DamagedSnapshotError(f"{path} is damaged: its part {part.name} changed on disk since it "
                                       f"was written (SHA-256 {digest[:16]}..., "
                                       f"{str(record.get('sha256'))[:16]}... was written). {hint}")
        body = self._read(part)
        if not isinstance(body, dict) or body.get("format") != FORMAT or body.get("rank") != rank:
            raise DamagedSnapshotError(f"{part} is not rank {rank}'s part of {path.name}. {hint}")
        return body

    def load(self, path: str | os.PathLike[str], fingerprint: str | None = None,
             lazy: bool = False) -> dict[str, Any]:
        """Read a snapshot after verifying its checksum; raises SnapshotError (naming the file and the
        fix) when it cannot be resumed, :class:`DamagedSnapshotError` when its bytes are damaged.

        ``lazy`` maps the tensors from the file instead of reading them (for a look at the counters and
        settings, as the launcher takes before it starts ranks); the checksum is verified all the same.
        """
        path = Path(path)
        if not self.verify(path):
            log.warning("%s has no checksum file (written before ringtrain checked snapshots, or the file "
                        "was removed): loading it unverified", path)
        return self._load_body(path, fingerprint, lazy)

    def _load_body(self, path: Path, fingerprint: str | None, lazy: bool = False) -> dict[str, Any]:
        body = self._read(path, lazy)
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise SnapshotError(f"{path} is not a ringtrain snapshot (no '{FORMAT}' marker). HINT: point "
                                "--snapshot-dir at a folder of ringtrain snapshots, or move this file away.")
        if fingerprint is not None and body.get("fingerprint") != fingerprint:
            raise SnapshotError(
                f"{path} was written for a different model (fingerprint {body.get('fingerprint')}, this "
                f"model has {fingerprint}): its weights cannot be loaded. HINT: resume with the snapshot's "
                "model (--arch), or use another --snapshot-dir for this model, or delete the old snapshots "
                "to start afresh.")
        return body

    def _read(self, path: Path, lazy: bool = False) -> Any:
        hint = (f"HINT: delete {path} to resume from the previous snapshot (or start afresh if it is the "
                "only one).")
        try:
            if lazy and zipfile.is_zipfile(path):  # torch maps only its zip format
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise SnapshotError(f"{path} does not exist. HINT: check --snapshot-dir.") from None
        except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DamagedSnapshotError(f"{path} is damaged or truncated and cannot be read ({reason}). "
                                       f"{hint}") from None
        except Exception as exc:  # weights_only refuses foreign pickles with UnpicklingError
            raise DamagedSnapshotError(f"{path} is damaged, truncated or not a snapshot that loads safely "
                                       f"with weights_only=True ({type(exc).__name__}). {hint}") from None

    def load_newest(self, fingerprint: str | None = None, lazy: bool = False) -> tuple[
            Path | None, dict[str, Any] | None, builtins.list[str]]:
        """The newest snapshot that verifies and loads: (path, body, why each newer one was skipped).

        (None, None, []) when the folder holds none. Damaged snapshots are skipped for older ones;
        when every snapshot is damaged, :class:`DamagedSnapshotError` names them all. A snapshot of
        another model (``fingerprint``) is not damage and stops the search with its error. A verified
        snapshot is preferred to a newer one without a checksum file (which is named among the skipped);
        an unverified one is loaded only where none verifies, with a warning that says so. ``lazy``: as
        for :meth:`load`.
        """
        skipped: list[str] = []
        unverified: list[Path] = []
        for path in reversed(self.list()):
            try:
                if not self.verify(path):
                    unverified.append(path)
                    continue
                body = self._load_body(path, fingerprint, lazy)
            except DamagedSnapshotError as exc:
                skipped.append(str(exc).split(" HINT:", 1)[0])
                continue
            skipped += [f"{p} has no checksum file (unverified; the older {path.name} verifies)"
                        for p in unverified]
            return path, body, skipped
        for path in unverified:  # newest first: none verifies
            try:
                log.warning("%s has no checksum file (written before ringtrain checked snapshots, or the "
                            "file was removed) and no snapshot there verifies: loading it unverified", path)
                return path, self._load_body(path, fingerprint, lazy), skipped
            except DamagedSnapshotError as exc:
                skipped.append(str(exc).split(" HINT:", 1)[0])
        if skipped:
            raise DamagedSnapshotError(
                f"every snapshot in {self.folder} is damaged, none can be resumed: " + "; ".join(skipped)
                + " HINT: delete them (or move them away) to start afresh, or run with --no-resume "
                "(TrainerConfig.resume=False).")
        return None, None, []
