"""The one line a script prints to tell ``ringtrain bench`` how much it trained in how long.

A script run by ``ringtrain bench -- python train.py`` is timed from start to exit (its wall time).
To also get items/s with start-up and warm-up left out, it calls, on every rank (or on rank 0 only)::

    import ringtrain.bench
    ringtrain.bench.report(items=images_done, seconds=elapsed)   # after the timed part

which prints one line to stdout::

    RINGTRAIN_BENCH {"items": 20480, "seconds": 12.5, "rank": 0, "world_size": 2}

It prints only when ``ringtrain bench`` runs the script (which sets ``RINGTRAIN_BENCH=1`` in the
environment of its runs, :data:`ENV_VAR`): in a plain ``ringtrain run``, ``horovodrun`` or ``python``
run the call checks its values and prints nothing, so a script can keep it without its users seeing
raw JSON lines.

Any program (not only Python) may print that line itself, best only when ``RINGTRAIN_BENCH`` is set;
the launcher's ``[rank]`` prefix and any other text before the tag are ignored. ``items`` counts what
this process trained (not all ranks); ``ringtrain bench`` adds up the ranks that reported and, when
only some did, assumes the others were as fast (data-parallel ranks move in lockstep).

A line is either the whole timed part (the last such line of a rank counts) or one epoch of it
(``"epoch": k``): a rank's epoch lines are added up, so a script can report after every epoch and
``ringtrain bench`` gives the time per epoch. Start-up (interpreter, imports, data loading, process
group) is never in ``seconds``: that is the point of reporting.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

TAG = "RINGTRAIN_BENCH"
"""The marker at the start of a report line (after an optional launcher prefix)."""

ENV_VAR = "RINGTRAIN_BENCH"
"""Set to ``1`` by ``ringtrain bench`` for every run it starts: :func:`report` prints only then."""


def reporting(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``ringtrain bench`` runs this process (:data:`ENV_VAR` set to ``1``), so report lines
    have a reader; anything else (unset, empty, ``0``) keeps :func:`report` quiet."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _rank_and_size() -> tuple[int, int]:
    """This process's rank and the job size, from the launcher's variables (0 and 1 for a plain run)."""
    for rank_var, size_var in (("HOROVOD_RANK", "HOROVOD_SIZE"), ("RANK", "WORLD_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"),
                               ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_var in os.environ and size_var in os.environ:
            try:
                return int(os.environ[rank_var]), int(os.environ[size_var])
            except ValueError:
                continue
    return 0, 1


def report(items: float, seconds: float, *, steps: int | None = None, epoch: int | None = None,
           epochs: float | None = None, gradient_bytes: int | None = None, **extra: Any) -> str:
    """Print this process's throughput for ``ringtrain bench`` (and return the line).

    The line is printed only under ``ringtrain bench`` (:func:`reporting`); elsewhere it is checked
    and returned, not printed.

    ``items``: samples (images, tokens, ...) this process trained in the timed part, warm-up left out.
    ``seconds``: how long that took. ``steps`` (optimizer steps in those seconds) and
    ``gradient_bytes`` (bytes of gradients allreduced per step) are optional; with both, the
    scaling projection can use a user script too. ``epoch=k``: this line is epoch ``k`` alone (call
    once per epoch; the sweep adds them up); ``epochs=E``: a line for the whole timed part that
    covered ``E`` epochs. Either gives the table a time per epoch. Extra keyword values are kept in
    scaling.json.
    """
    if not (isinstance(items, int | float) and math.isfinite(items) and items >= 0):
        raise ValueError(f"items={items!r} must be a finite number >= 0. HINT: pass the count of samples "
                         "trained in the timed part, e.g. report(items=steps * batch_size, seconds=...).")
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds={seconds!r} must be a finite number > 0. HINT: pass the elapsed time "
                         "of the timed part, e.g. time.perf_counter() - start.")
    rank, world_size = _rank_and_size()
    body: dict[str, Any] = {"items": items, "seconds": seconds, "rank": rank, "world_size": world_size,
                            "host": socket.gethostname()}
    if steps is not None:
        body["steps"] = int(steps)
    if epoch is not None and epochs is not None:
        raise ValueError(f"epoch={epoch!r} and epochs={epochs!r} were both given. HINT: epoch=k for a line "
                         "per epoch, epochs=E for one line covering E epochs.")
    if epoch is not None:
        body["epoch"] = int(epoch)
    if epochs is not None:
        if not (isinstance(epochs, int | float) and math.isfinite(epochs) and epochs > 0):
            raise ValueError(f"epochs={epochs!r} must be a number > 0. HINT: pass how many epochs the "
                             "reported seconds covered, e.g. epochs=2.")
        body["epochs"] = epochs
    if gradient_bytes is not None:
        body["gradient_bytes"] = int(gradient_bytes)
    body.update(extra)
    line = f"{TAG} {json.dumps(body, default=float)}"
    if not reporting():  # nobody reads the line outside ringtrain bench: keep the user's output clean
        return line
    # one write with its newline: lines of ranks sharing a pipe must not interleave mid-line
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return line


def parse_line(line: str) -> dict[str, Any] | None:
    """The report carried by one output line, or None when the line holds none (or a broken one)."""
    at = line.find(TAG + " ")
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(TAG) + 1:])
    except json.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def parse_output(text: str) -> list[dict[str, Any]]:
    """Every report in a run's output, in order."""
    found = []
    for line in text.splitlines():
        body = parse_line(line)
        if body is not None:
            found.append(body)
    return found


def parameters_digest(model: Any) -> str:
    """A hash of the model's parameters, bit for bit (the ranks of a data-parallel run must agree on it).

    Buffers are left out: BatchNorm's running statistics follow each rank's own batches in Horovod.
    Pass it to :func:`report` (``parameters_digest=...``) and ``ringtrain bench`` fails a run whose
    ranks disagree. ``model`` is a ``torch.nn.Module``.
    """
    import torch

    hasher = hashlib.blake2b(digest_size=16)
    for _, parameter in sorted(model.named_parameters()):
        hasher.update(parameter.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()
