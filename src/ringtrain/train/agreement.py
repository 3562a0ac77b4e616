"""Failure paths every rank agrees on: a collective outside the step first checks that every rank got there.

A rank that raises on its own (rank 0's ``torch.save`` on a full disk, one rank's evaluation) used to
leave the others waiting in the collective that followed, until the process group's timeout (minutes),
while the failed rank waited for them in the teardown's barrier. :func:`agreed` wraps such a local
piece of work: every rank runs it, then all take part in one small sum that says whether any of them
failed. When one did, every rank raises, at once: the failed rank its own exception, the others a
:class:`RankFailedError` (or a :class:`SnapshotError`, when the failed rank's was one, so that the
command line reports it as the same usage error) naming the rank, what it was doing and its error
(with the errno's symbol, ENOSPC, EACCES, ...). The sum is one float when nothing failed; the message
crosses over only on failure.
"""

from __future__ import annotations

import contextlib
import errno as errno_codes
import time
from collections.abc import Callable, Iterator

import torch

from ringtrain.exceptions import SnapshotError

#: Bytes of the failed rank's message that reach the other ranks.
MESSAGE_BYTES = 400
_SNAPSHOT_KIND, _OTHER_KIND = 1.0, 2.0


class RankFailedError(RuntimeError):
    """Another rank failed outside the training step; ``rank`` is which, the message says what and why."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
        self.rank = rank


def describe(exc: BaseException) -> str:
    """One line naming an exception: its errno's symbol where it has one (ENOSPC, EACCES, EISDIR)."""
    text = str(exc).strip() or type(exc).__name__
    code = _errno_of(exc)
    if code and (name := errno_codes.errorcode.get(code)) and name not in text:
        text = f"[{name}] {text}"
    if not isinstance(exc, SnapshotError | OSError):
        text = f"{type(exc).__name__}: {text}"
    return text


def _errno_of(exc: BaseException | None) -> int:
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno:
            return int(exc.errno)
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return 0


SumFn = Callable[[torch.Tensor], torch.Tensor]


def check_all(sum_fn: SumFn, rank: int, world_size: int, what: str, failure: BaseException | None) -> None:
    """Every rank calls this with its own ``failure`` (None: it did ``what`` fine); raises on every rank
    when any rank failed (collective)."""
    if world_size == 1:
        if failure is not None:
            raise failure
        return
    if sum_fn(torch.tensor([0.0 if failure is None else 1.0], dtype=torch.float64)).item() == 0:
        return
    # some rank failed: every rank learns which and why (rows of zeros but the failed ranks')
    width = 2 + MESSAGE_BYTES
    table = torch.zeros((world_size, width), dtype=torch.float64)
    if failure is not None:
        encoded = describe(failure).encode("utf-8", "replace")[:MESSAGE_BYTES]
        table[rank, 0] = _SNAPSHOT_KIND if isinstance(failure, SnapshotError) else _OTHER_KIND
        table[rank, 1] = _errno_of(failure)
        table[rank, 2:2 + len(encoded)] = torch.tensor(list(encoded), dtype=torch.float64)
    table = sum_fn(table)
    if failure is not None:
        raise failure
    first = int(torch.nonzero(table[:, 0]).flatten()[0].item())
    row = table[first]
    body = bytes(int(v) for v in row[2:].tolist() if v).decode("utf-8", "replace")
    message = f"rank {first} failed {what}: {body}"
    if row[0].item() == _SNAPSHOT_KIND:
        raise SnapshotError(message)
    raise RankFailedError(message + " (this rank stops with it)", first)


@contextlib.contextmanager
def agreed(sum_fn: SumFn, rank: int, world_size: int, what: str) -> Iterator[None]:
    """``with agreed(strategy.sum, rank, size, "writing a snapshot"): local work`` - every rank raises
    when the work failed on any rank (see :func:`check_all`); the block must hold no collective."""
    failure: BaseException | None = None
    try:
        yield
    except Exception as exc:  # every failure is agreed on; KeyboardInterrupt is not
        # when it failed, before the others heard of it: the root-cause report names this rank first
        exc.failed_at = time.time()  # type: ignore[attr-defined]  # a mark on any exception, read by getattr
        failure = exc
    check_all(sum_fn, rank, world_size, what, failure)


__all__ = ["MESSAGE_BYTES", "RankFailedError", "agreed", "check_all", "describe"]
