"""PowerSGD: low-rank gradient compression with error feedback (Vogels, Karimireddy and Jaggi,
"PowerSGD: Practical Low-Rank Gradient Compression", NeurIPS 2019), for ``DistributedOptimizer``.

A gradient of shape ``(n, d1, d2, ...)`` is seen as an ``n x m`` matrix (``m = d1 * d2 * ...``). Each
rank adds the update it still owes (its error feedback ``e``) to its gradient, ``M = g + e``, and
sends two thin factors instead of ``M``:

1. ``P_i = M_i Q`` with ``Q`` (``m x rank``) kept from the previous step (the warm start: one power
   iteration per step, continued across steps); the ``P_i`` are allreduced and ``P`` orthonormalised;
2. ``Q_i = M_i^T P``; the ``Q_i`` are allreduced; the gradient becomes ``P Q^T`` and the rank keeps
   ``e = M_i - P Q_i^T``, what its own matrix lost, for the next step.

``(n + m) * rank`` numbers travel instead of ``n * m``. Tensors of one dimension (biases, norms) and
matrices too small for the factors to pay (``n m <= min_compression_rate * rank * (n + m)``) travel
as they are, in the same flat buffer as the first factors. Because averaging is linear, a gradient
whose average over the ranks has rank at most ``rank`` comes out exactly (up to rounding).

This module is the math and the state, with no communication: :class:`PowerSGDBucket` turns one
bucket's gradients into flat buffers to reduce (:meth:`~PowerSGDBucket.start`,
:meth:`~PowerSGDBucket.middle`) and finishes the gradients from the reduced buffers
(:meth:`~PowerSGDBucket.finish`). :mod:`ringtrain.optimizer` does the allreduces.

Matrix work runs on the gradient's device, in its dtype (float32 for float16 and bfloat16 gradients,
whose results are cast back). The orthonormalisation (a Householder QR, batched over equally shaped
matrices) runs on every rank on identical reduced inputs; ranks of one kind of machine agree bit for
bit, ranks whose linear algebra rounds differently (different CPUs or GPUs) can drift apart slowly,
as with any locally computed decompression.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

log = logging.getLogger("ringtrain.powersgd")

#: The key ``DistributedOptimizer.state_dict()`` adds for PowerSGD's state.
STATE_KEY = "ringtrain_powersgd"

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_MISUSE = ("{config} only works with hvd.DistributedOptimizer: PowerSGD keeps state per parameter "
           "across steps (the warm start and each rank's error feedback), which {what} does not have. "
           "HINT: pass it as DistributedOptimizer(optimizer, named_parameters=..., compression={config}); "
           "here use compression=hvd.Compression.none, fp16 or bf16.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class PowerSGDConfig:
    """What ``hvd.Compression.powersgd(...)`` returns; ``DistributedOptimizer(compression=...)`` takes it.

    ``rank``: the factors' width (higher: closer to the full gradient, more bytes). ``start_iter``:
    optimizer steps allreduced uncompressed first (the early gradients change fastest). A matrix is
    compressed only when its factors are at least ``min_compression_rate`` times smaller than it.
    ``seed``: the first ``Q`` of every matrix, the same on every rank.
    """

    rank: int = 4
    start_iter: int = 10
    min_compression_rate: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        # Raised where the user writes the configuration: the same on every rank, before any collective.
        if not _is_int(self.rank) or self.rank < 1:
            raise ValueError(f"Compression.powersgd(rank={self.rank!r}): the rank must be a positive whole "
                             "number. HINT: use e.g. rank=4 (1 to 8 is usual; higher sends more bytes).")
        if not _is_int(self.start_iter) or self.start_iter < 0:
            raise ValueError(f"Compression.powersgd(start_iter={self.start_iter!r}): the number of "
                             "uncompressed steps must be a whole number of at least 0. HINT: use "
                             "start_iter=0 to compress from the first step, or e.g. start_iter=10.")
        rate = self.min_compression_rate
        if (isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate)
                or rate < 1):
            raise ValueError(f"Compression.powersgd(min_compression_rate={rate!r}): must be a number of at "
                             "least 1 (a matrix is compressed only when its factors are that many times "
                             "smaller than it). HINT: use e.g. min_compression_rate=2.0.")
        if not _is_int(self.seed):
            raise ValueError(f"Compression.powersgd(seed={self.seed!r}): the seed must be a whole number. "
                             "HINT: use e.g. seed=0 (every rank must use the same one).")

    def __str__(self) -> str:
        return (f"hvd.Compression.powersgd(rank={self.rank}, start_iter={self.start_iter}, "
                f"min_compression_rate={self.min_compression_rate}, seed={self.seed})")

    def as_dict(self) -> dict[str, Any]:
        """The configuration as plain values (saved in the state dict)."""
        return asdict(self)

    # PowerSGD is not a Compressor: the collectives that take ``compression=`` call these, and the
    # error names the one place it works.
    def compress(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Refused: PowerSGD only works inside ``DistributedOptimizer``."""
        raise ValueError(_MISUSE.format(config=self, what="a single collective"))

    def decompress(self, tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Refused: PowerSGD only works inside ``DistributedOptimizer``."""
        raise ValueError(_MISUSE.format(config=self, what="a single collective"))

    def compresses(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> bool:
        """Whether a gradient of ``shape`` and ``dtype`` travels as rank-``rank`` factors."""
        view = matrix_shape(shape)
        if view is None or not dtype.is_floating_point:
            return False
        n, m = view
        return n * m > self.min_compression_rate * self.rank * (n + m)


def misuse_error(config: PowerSGDConfig, what: str) -> ValueError:
    """The error for PowerSGD given where it cannot work (``what``: that place, in words)."""
    return ValueError(_MISUSE.format(config=config, what=what))


def matrix_shape(shape: Sequence[int]) -> tuple[int, int] | None:
    """``(n, m)``: a tensor of ``shape`` as a matrix, its first dimension by all the others; None for
    fewer than two dimensions."""
    if len(shape) < 2:
        return None
    return int(shape[0]), math.prod(int(d) for d in shape[1:])


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype PowerSGD computes in for gradients of ``dtype``: 16-bit floats lose too much in the
    matrix products and QR (and QR has no 16-bit kernels), so those work in float32."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def largest_useful_rank(shape: Sequence[int], min_compression_rate: float) -> int:
    """The largest rank at which a gradient of ``shape`` would still be compressed (0: none)."""
    view = matrix_shape(shape)
    if view is None:
        return 0
    n, m = view
    rank = int(n * m / (min_compression_rate * (n + m)))
    while rank >= 1 and not n * m > min_compression_rate * rank * (n + m):
        rank -= 1  # the division rounded up across an exact boundary
    return rank


def check_model(config: PowerSGDConfig, shapes: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> None:
    """Refuse a configuration under which no gradient of the model (``name -> (shape, dtype)`` of the
    trainable parameters) would be compressed: PowerSGD would only cost compute."""
    if any(config.compresses(shape, dtype) for shape, dtype in shapes.values()):
        return
    matrices = {name: shape for name, (shape, dtype) in shapes.items()
                if dtype.is_floating_point and matrix_shape(shape) is not None}
    if not matrices:
        raise ValueError(f"{config}: none of the optimizer's {len(shapes)} trainable parameters is a "
                         "floating-point tensor of two or more dimensions, so nothing would be compressed. "
                         "HINT: use compression=hvd.Compression.none (or fp16/bf16).")
    best = max(matrices, key=lambda name: largest_useful_rank(matrices[name], config.min_compression_rate))
    useful = largest_useful_rank(matrices[best], config.min_compression_rate)
    n, m = matrix_shape(matrices[best]) or (0, 0)
    if useful < 1:
        raise ValueError(f"{config}: every gradient matrix is too small to pay at min_compression_rate="
                         f"{config.min_compression_rate} (the largest, {best}, is {n} x {m}), so nothing "
                         "would be compressed. HINT: use compression=hvd.Compression.none, or a lower "
                         "min_compression_rate (1.0 is the least).")
    raise ValueError(f"{config}: rank {config.rank} is too large: no gradient matrix would be compressed "
                     f"(a matrix n x m is compressed when n*m > {config.min_compression_rate} * rank * "
                     f"(n+m); the largest, {best}, {n} x {m}, pays up to rank {useful}). HINT: use "
                     f"rank={useful} or lower.")


def summary(config: PowerSGDConfig, params: Mapping[str, torch.Tensor]) -> str:
    """One line: how many tensors and bytes PowerSGD compresses, and what one step then sends."""
    total = sent = compressed_bytes = 0
    compressed = 0
    for p in params.values():
        size = p.numel() * p.element_size()
        total += size
        view = matrix_shape(p.shape)
        if view is not None and config.compresses(p.shape, p.dtype):
            n, m = view
            compressed += 1
            compressed_bytes += size
            sent += (n + m) * config.rank * torch.finfo(work_dtype(p.dtype)).bits // 8
        else:
            sent += size
    ratio = total / sent if sent else 1.0
    return (f"PowerSGD rank {config.rank}: {compressed} of {len(params)} gradient tensors "
            f"({compressed_bytes / 2**20:.2f} of {total / 2**20:.2f} MiB) travel as factors: "
            f"{sent / 2**20:.3f} MiB per step instead of {total / 2**20:.2f} MiB ({ratio:.1f}x less on the "
            f"wire) after {config.start_iter} uncompressed step(s)")


def orthonormalize_(batch: torch.Tensor) -> torch.Tensor:
    """Replace the columns of every matrix of ``batch`` (``(k, a, r)`` or ``(a, r)``, ``a >= r``) by an
    orthonormal basis of their span, in place; returns ``batch``.

    A Householder QR, batched over the leading dimension (one kernel call for all equally shaped
    matrices). Unlike Gram-Schmidt it never divides by a column's norm: a zero or rank-deficient
    matrix gets orthonormal columns completing the basis instead of NaN (a zero column's reflector is
    the identity), so a layer whose gradient is zero for a step does not poison the next warm start.
    """
    q, _ = torch.linalg.qr(batch, mode="reduced")
    batch.copy_(q)
    return batch


def _q_layout(q: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """``q`` (m x rank) stored as the transpose of a row-major rank x m tensor: ``M Q`` and ``P Q^T``
    then read Q^T row by row, and ``Q_i^T = P^T M`` is written so (about twice as fast on a CPU core as
    the m x rank layout, where the long dimension is strided). ``copy``: never share ``q``'s storage."""
    qt = q.t()
    return (qt.clone(memory_format=torch.contiguous_format) if copy else qt.contiguous()).t()


def _initial_q(config: PowerSGDConfig, names: Sequence[str],
               ms: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """Every matrix's first ``Q``: drawn from one CPU generator seeded with ``config.seed`` in name
    order, so every rank (and every device type) gets the same; orthonormalised in float64."""
    gen = torch.Generator().manual_seed(config.seed)
    return {name: orthonormalize_(torch.randn(ms[name], config.rank, generator=gen, dtype=torch.float64))
            for name in sorted(names)}


@dataclass(frozen=True)
class Matrix:
    """A parameter whose gradient PowerSGD compresses: its name, shape, matrix view and work dtype."""

    name: str
    shape: torch.Size
    n: int
    m: int
    dtype: torch.dtype


class PowerSGDState:
    """PowerSGD's state for one optimizer on one rank: the step count, each matrix's warm-start ``Q``
    (the same on every rank) and error feedback (this rank's own, allocated at the first compressed
    step).

    The error feedback belongs to the rank and world it was made in (``errors_for``, set by
    :meth:`enter_world`): an elastic reset that re-forms the world with another size, or gives this
    process another rank, drops it (zero: what this rank owed is lost, no update is applied twice)
    and keeps ``Q`` and the step count, which are the same on every rank.
    """

    def __init__(self, config: PowerSGDConfig, params: Mapping[str, torch.Tensor]) -> None:
        self.config = config
        self.step = 0
        self.matrices: dict[str, Matrix] = {}
        for name, p in params.items():
            view = matrix_shape(p.shape)
            if view is not None and config.compresses(p.shape, p.dtype):
                self.matrices[name] = Matrix(name, p.shape, view[0], view[1], work_dtype(p.dtype))
        self._devices = {name: params[name].device for name in self.matrices}
        self.q: dict[str, torch.Tensor] = {}
        self._reset_q(self.matrices)
        self.errors: dict[str, torch.Tensor] = {}
        #: (rank, size) the error feedback belongs to; None until the first world is entered.
        self.errors_for: tuple[int, int] | None = None

    def _reset_q(self, names: Sequence[str] | Mapping[str, Any]) -> None:
        names = list(names)
        for name, q in _initial_q(self.config, names, {n: self.matrices[n].m for n in names}).items():
            self.q[name] = _q_layout(q.to(dtype=self.matrices[name].dtype, device=self._devices[name]))

    def place(self, name: str, device: torch.device) -> None:
        """Move a matrix's state to ``device`` (a model moved after its optimizer was built)."""
        if self.q[name].device != device:
            self._devices[name] = device
            self.q[name] = _q_layout(self.q[name].to(device))
            if name in self.errors:
                self.errors[name] = self.errors[name].to(device)

    def error(self, name: str) -> torch.Tensor:
        """The matrix's error feedback (in the parameter's shape, work dtype), zero when new."""
        e = self.errors.get(name)
        if e is None:
            mat = self.matrices[name]
            e = self.errors[name] = torch.zeros(mat.shape, dtype=mat.dtype, device=self.q[name].device)
        return e

    def enter_world(self, rank: int, size: int) -> None:
        """The world this rank works in now; error feedback made in another (size or rank) is dropped."""
        if self.errors_for is not None and self.errors_for != (rank, size):
            self.errors.clear()
        self.errors_for = (rank, size)

    def advance(self) -> None:
        """One step's gradients were reduced (compressed or not)."""
        self.step += 1

    def state_dict(self, rank: int | None = None, size: int | None = None) -> dict[str, Any]:
        """``{"rank", "size", "step", "config", "q": {name: tensor}, "errors": {name: tensor}}``.

        ``rank``/``size``: this rank's world now (error feedback from an older world is dropped
        first); None where it is unknown (no engine), which reports the world the errors belong to.
        Tensors are the live state, as ``torch.optim.Optimizer.state_dict()`` returns its own: copy them
        (``copy.deepcopy``, ``torch.save``) to keep a snapshot.
        """
        if rank is not None and size is not None:
            self.enter_world(rank, size)
        held = self.errors_for or (rank, size)
        return {"rank": held[0], "size": held[1], "step": self.step, "config": self.config.as_dict(),
                "q": dict(self.q), "errors": dict(self.errors)}

    def load_state_dict(self, saved: Mapping[str, Any] | None, rank: int | None, size: int | None) -> None:
        """Take the state of :meth:`state_dict` (or of :func:`merge_powersgd_states`) in this rank's world.

        ``saved`` None (a checkpoint without PowerSGD state): the error feedback is zeroed, ``Q`` and
        the step are kept. Otherwise the step is taken; each matrix's ``Q`` where the saved one has the
        shape this configuration needs (another rank: re-initialised from the seed, not an error); the
        error feedback only if it was saved by this very rank of a world of this size, or merged for
        any world (``rank`` None), zero otherwise.
        """
        if saved is None:
            self.errors.clear()
            return
        _check_state(saved)
        self.step = int(saved["step"])
        stale = []
        for name, mat in self.matrices.items():
            q = saved["q"].get(name)
            if torch.is_tensor(q) and tuple(q.shape) == (mat.m, self.config.rank):
                # a copy: training updates Q in place, and the caller's dict must not change with it
                q = q.detach().to(dtype=mat.dtype, device=self._devices[name])
                self.q[name] = _q_layout(q, copy=True)
            else:
                stale.append(name)
        self._reset_q(stale)
        self.errors.clear()
        merged = saved["rank"] is None and saved["size"] is None
        if merged or (saved["rank"], saved["size"]) == (rank, size):
            for name, mat in self.matrices.items():
                e = saved["errors"].get(name)
                if torch.is_tensor(e) and tuple(e.shape) == tuple(mat.shape):
                    self.errors[name] = e.detach().to(dtype=mat.dtype, device=self._devices[name]).clone()
        # What was loaded belongs to this world (None: to the first one entered).
        self.errors_for = (rank, size) if rank is not None and size is not None else None


def _check_state(saved: Any) -> None:
    keys = {"rank", "size", "step", "config", "q", "errors"}
    if not isinstance(saved, Mapping) or not keys <= set(saved):
        found = sorted(saved) if isinstance(saved, Mapping) else type(saved).__name__
        raise ValueError(f"not a PowerSGD state: expected a dict with keys {sorted(keys)}, got {found}. "
                         f"HINT: pass optimizer.state_dict() (its {STATE_KEY!r} entry is the PowerSGD "
                         "state).")


def merge_powersgd_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge every rank's saved PowerSGD state into one that any rank of any world size can load.

    ``states``: one per rank of the world that saved them, each ``optimizer.state_dict()`` or its
    ``"ringtrain_powersgd"`` entry. The error feedback is averaged over the ranks and ``Q`` and the step
    are taken from rank 0's: what the ranks still owe the average gradient (``op=hvd.Average``) is
    preserved when every rank of the next world starts from the mean error. (With ``op=hvd.Sum`` the
    owed sum is preserved only at the same world size.) The result has ``rank`` and ``size`` None, which
    ``load_state_dict`` applies on every rank. Given whole optimizer state dicts, returns rank 0's with
    the merged entry (ready for ``optimizer.load_state_dict``); given entries, returns the merged entry.
    """
    if not states:
        raise ValueError("merge_powersgd_states([]): nothing to merge. HINT: pass every rank's "
                         "optimizer.state_dict(), one per rank.")
    whole = [STATE_KEY in s for s in states]
    inner = [s.get(STATE_KEY, s) for s in states]
    for s in inner:
        _check_state(s)
    size = inner[0]["size"]
    ranks = sorted(s["rank"] for s in inner if s["rank"] is not None)
    if size is None or len(inner) != size or ranks != list(range(size)):
        raise ValueError(f"merge_powersgd_states: got the states of ranks {[s['rank'] for s in inner]} of "
                         f"worlds of size {sorted({str(s['size']) for s in inner})}; one state of each rank "
                         "of one world is needed. HINT: save optimizer.state_dict() on every rank at the "
                         "same step and pass them all.")
    steps = sorted({int(s["step"]) for s in inner})
    if len(steps) > 1:
        raise ValueError(f"merge_powersgd_states: the states were saved at different steps {steps}. HINT: "
                         "save every rank's optimizer.state_dict() at the same step.")
    first = next(i for i, s in enumerate(inner) if s["rank"] == 0)
    # Summed in float64 (a rank without an entry owes nothing there), then back to the saved dtype.
    totals: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for s in inner:
        for name, e in s["errors"].items():
            e = e.detach().double()
            totals[name] = totals[name] + e.to(totals[name].device) if name in totals else e
            dtypes.setdefault(name, s["errors"][name].dtype)
    merged = {"rank": None, "size": None, "step": steps[0], "config": dict(inner[first]["config"]),
              "q": {name: q.detach().clone() for name, q in inner[first]["q"].items()},
              "errors": {name: (total / size).to(dtypes[name]) for name, total in totals.items()}}
    if all(whole):
        result = dict(states[first])
        result[STATE_KEY] = merged
        return result
    return merged


@dataclass
class _Layout:
    """One bucket's flat buffers and the views into them (built for a device and gradient dtypes)."""

    key: tuple[Any, ...]
    phase1: list[torch.Tensor]  # one per dtype: the uncompressed gradients, then the P_i
    phase2: list[torch.Tensor]  # one per work dtype: the Q_i, each transposed (rank x m, row-major)
    own: list[torch.Tensor]  # a copy of phase2 before its reduction: this rank's own Q_i
    plain: list[torch.Tensor]  # a flat segment per uncompressed member
    p: list[torch.Tensor]  # (n, rank) per compressed member
    qt: list[torch.Tensor]  # (rank, m): Q^T
    qt_own: list[torch.Tensor]  # (rank, m), in ``own``
    p_batches: list[torch.Tensor]  # (k, n, rank) views over equally shaped P
    q_batches: list[tuple[torch.Tensor, list[int]]]  # (k, m, rank) views (of Q^T's), and whose


class PowerSGDBucket:
    """One bucket's PowerSGD work on one rank, without communication.

    Per step: ``start(grads)`` returns the flat buffers of phase 1 (the uncompressed gradients and every
    ``P_i = M_i Q``); reduce them in place across the ranks (every rank's buffers have the same
    layout); ``middle()`` writes the uncompressed gradients back, orthonormalises ``P`` and returns the
    buffers of phase 2 (every ``Q_i = M_i^T P``; empty when the bucket compresses nothing); reduce them
    in place; ``finish()`` writes ``P Q^T`` into the gradients given to ``start`` and returns them,
    updates the error feedback and keeps the reduced ``Q`` (orthonormalised) as the next warm start.

    A step whose reduced buffers hold inf or NaN (a GradScaler overflow: the optimizer step will be
    skipped) writes them into the gradients as they are, so the scaler sees them, and leaves the error
    feedback and ``Q`` as they were: the decision is taken on reduced values, so every rank takes it.
    """

    def __init__(self, state: PowerSGDState, names: Sequence[str]) -> None:
        self.state = state
        self.names = list(names)
        compressed = [i for i, name in enumerate(self.names) if name in state.matrices]
        # Equal shapes side by side: their P (and Q) are one contiguous batch for QR.
        matrices = state.matrices

        def shape_key(i: int) -> tuple[str, int, int]:
            mat = matrices[self.names[i]]
            return str(mat.dtype), mat.n, mat.m

        self._compressed = sorted(compressed, key=shape_key)
        self._plain = [i for i in range(len(self.names)) if self.names[i] not in matrices]
        self._layout: _Layout | None = None
        self._grads: list[torch.Tensor] | None = None

    def _layout_for(self, grads: Sequence[torch.Tensor]) -> _Layout:
        device = grads[0].device
        key = (device, tuple(grads[i].dtype for i in self._plain))
        if self._layout is not None and self._layout.key == key:
            return self._layout
        rank = self.state.config.rank
        sizes1: dict[torch.dtype, int] = {}
        sizes2: dict[torch.dtype, int] = {}
        plain_at, p_at, q_at = [], [], []
        for i in self._plain:
            dtype = grads[i].dtype
            plain_at.append((dtype, sizes1.get(dtype, 0), grads[i].numel()))
            sizes1[dtype] = sizes1.get(dtype, 0) + grads[i].numel()
        for i in self._compressed:
            mat = self.state.matrices[self.names[i]]
            self.state.place(mat.name, device)
            p_at.append((mat.dtype, sizes1.get(mat.dtype, 0), mat.n))
            sizes1[mat.dtype] = sizes1.get(mat.dtype, 0) + mat.n * rank
            q_at.append((mat.dtype, sizes2.get(mat.dtype, 0), mat.m))
            sizes2[mat.dtype] = sizes2.get(mat.dtype, 0) + mat.m * rank
        # dtypes in a fixed order: every rank builds the same buffers
        buf1 = {dt: torch.empty(sizes1[dt], dtype=dt, device=device) for dt in sorted(sizes1, key=str)}
        buf2 = {dt: torch.empty(sizes2[dt], dtype=dt, device=device) for dt in sorted(sizes2, key=str)}
        own = {dt: torch.empty_like(b) for dt, b in buf2.items()}
        layout = _Layout(
            key=key, phase1=list(buf1.values()), phase2=list(buf2.values()), own=list(own.values()),
            plain=[buf1[dt][at:at + numel] for dt, at, numel in plain_at],
            p=[buf1[dt][at:at + rows * rank].view(rows, rank) for dt, at, rows in p_at],
            qt=[buf2[dt][at:at + rows * rank].view(rank, rows) for dt, at, rows in q_at],
            qt_own=[own[dt][at:at + rows * rank].view(rank, rows) for dt, at, rows in q_at],
            p_batches=[], q_batches=[])
        start = 0
        for end in range(1, len(self._compressed) + 1):
            if end < len(self._compressed) and (self._shape(end) == self._shape(start)):
                continue
            k = end - start
            dt, p0, n = p_at[start]
            _, q0, m = q_at[start]
            layout.p_batches.append(buf1[dt][p0:p0 + k * n * rank].view(k, n, rank))
            q_batch = buf2[dt][q0:q0 + k * m * rank].view(k, rank, m).transpose(1, 2)
            layout.q_batches.append((q_batch, list(range(start, end))))
            start = end
        self._layout = layout
        return layout

    def _shape(self, j: int) -> tuple[torch.dtype, int, int]:
        mat = self.state.matrices[self.names[self._compressed[j]]]
        return mat.dtype, mat.n, mat.m

    def _matrix(self, grad: torch.Tensor, mat: Matrix) -> torch.Tensor:
        """The gradient as an n x m matrix in the work dtype (a view where it can be)."""
        g = grad.reshape(mat.n, mat.m)
        return g if g.dtype == mat.dtype else g.to(mat.dtype)

    def start(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Phase 1: the flat buffers to reduce, holding the uncompressed gradients and every ``P_i``.

        ``grads``: the members' dense gradients, in the order of ``names``; kept (unchanged) until
        :meth:`finish` writes the results into them.
        """
        layout = self._layout_for(grads)
        for i, segment in zip(self._plain, layout.plain):
            segment.view(grads[i].shape).copy_(grads[i])
        for j, i in enumerate(self._compressed):
            mat = self.state.matrices[self.names[i]]
            q, e = self.state.q[mat.name], self.state.error(mat.name)
            # P_i = (g + e) Q, without materialising g + e: g stays intact for finish()
            torch.mm(self._matrix(grads[i], mat), q, out=layout.p[j])
            layout.p[j].addmm_(e.view(mat.n, mat.m), q)
        self._grads = list(grads)
        return layout.phase1

    def middle(self) -> list[torch.Tensor]:
        """After phase 1's reduction: the uncompressed gradients are final; orthonormalise ``P`` and
        return the flat buffers of phase 2 (every ``Q_i = M_i^T P``; empty if nothing is compressed)."""
        layout, grads = self._layout, self._grads
        assert layout is not None, "start() comes first"
        assert grads is not None, "start() comes first"
        for i, segment in zip(self._plain, layout.plain):
            grads[i].copy_(segment.view(grads[i].shape))
        for batch in layout.p_batches:
            orthonormalize_(batch)
        for j, i in enumerate(self._compressed):
            mat = self.state.matrices[self.names[i]]
            p, e = layout.p[j], self.state.error(mat.name)
            # Q_i^T = P^T (g + e)
            torch.mm(p.t(), self._matrix(grads[i], mat), out=layout.qt[j])
            layout.qt[j].addmm_(p.t(), e.view(mat.n, mat.m))
        for own, buf in zip(layout.own, layout.phase2):
            own.copy_(buf)  # the reduction overwrites it; the error feedback needs this rank's Q_i
        return layout.phase2

    def finish(self) -> list[torch.Tensor]:
        """After phase 2's reduction: write ``P Q^T`` into the gradients given to :meth:`start` (returned,
        in the order of ``names``), update the error feedback and the warm start."""
        layout, grads = self._layout, self._grads
        assert layout is not None, "start() and middle() come first"
        assert grads is not None, "start() and middle() come first"
        self._grads = None
        if not self._compressed:
            return grads
        # One decision per bucket, on reduced values (the same on every rank): see the class docstring.
        finite = bool(torch.stack([torch.isfinite(b).all() for b in layout.phase1 + layout.phase2]).all())
        for j, i in enumerate(self._compressed):
            mat = self.state.matrices[self.names[i]]
            grad, p, qt = grads[i], layout.p[j], layout.qt[j]
            if finite:
                e = self.state.error(mat.name)
                # e = M_i - P Q_i^T: what this rank's own matrix lost, with M_i = g + e
                e.add_(grad)
                e.view(mat.n, mat.m).addmm_(p, layout.qt_own[j], alpha=-1)
            if grad.dtype == mat.dtype and grad.is_contiguous():
                torch.mm(p, qt, out=grad.view(mat.n, mat.m))
            else:
                grad.copy_((p @ qt).view(grad.shape))
        if finite:
            # The reduced Q, orthonormalised, is the next warm start: the same span (so the same next P
            # up to a change of basis), but a Q that collapsed (a zero gradient) gets a basis back.
            for batch, members in layout.q_batches:
                orthonormalize_(batch)
                for j in members:
                    self.state.q[self.names[self._compressed[j]]].copy_(layout.qt[j].t())
        return grads


__all__ = [
    "STATE_KEY", "PowerSGDBucket", "PowerSGDConfig", "PowerSGDState", "check_model", "largest_useful_rank",
    "matrix_shape", "merge_powersgd_states", "orthonormalize_", "summary", "work_dtype",
]
