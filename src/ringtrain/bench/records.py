"""Measurements: one ``Measurement`` per run, and one ``Row`` per (strategy, processes) over repeats.

A run's throughput comes from its ranks' report lines (:mod:`ringtrain.bench.hook`): the items of all
ranks over the time of the slowest rank. Ranks that did not report are assumed as fast as those that
did (data-parallel ranks move in lockstep; Horovod's synthetic benchmark reports rank 0 only). A run
without any report line has only its wall time; the sweep then measures the start-up of the same
command (:mod:`ringtrain.bench.startup`) and compares wall time minus start-up, labelled as such.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ringtrain.bench.plan import BASELINE, INDEPENDENT, is_competitor

SPREAD_WARNING = 0.20
"""A spread above this between repeats, or between the ranks of one run, gets a warning in the table."""

SHORT_RUN_S = 2.0
"""A run whose timed part is shorter than this (seconds) gets a warning: too short to be trusted.

One-off costs inside the timed part (a first collective's connection set-up, lazy allocations in the
first steps, a scheduler pause, another process taking a core, the clock settling after idle) last tens
to hundreds of milliseconds, and hit one run but not the next. Under 2 s, one 100 ms event moves a run's
items/s by over 5 %, so repeats of short runs disagree by more than a scaling table can say: one epoch
of examples/horovod_mnist.py (1.5 s a run at one process on two cores, less on a faster machine) read
efficiency 0.42 in one sweep and 1.87 in the next. Past 2 s such events fall to a few percent, within
what ``--repeats 3`` shows."""


@dataclass
class Measurement:
    """One run of the sweep, as measured (or as it failed)."""

    index: int
    repeat: int
    strategy: str
    np: int
    status: str = "ok"
    """``ok`` or ``failed``."""
    error: str | None = None
    exit_code: int | None = None
    wall_seconds: float | None = None
    """From starting the process tree to its exit: start-up and warm-up included."""
    argv: list[str] = field(default_factory=list)
    log: str | None = None
    """The run's output (stdout and stderr), relative to the output folder."""
    reports: list[dict[str, Any]] = field(default_factory=list)
    """Every report line of the run, as the ranks printed them."""
    items: float | None = None
    """Items of all ranks in the timed part."""
    seconds: float | None = None
    """The timed part, on the slowest rank."""
    steps: int | None = None
    items_per_second: float | None = None
    seconds_per_step: float | None = None
    seconds_per_epoch: float | None = None
    ranks_reported: int = 0
    extrapolated: bool = False
    """True when fewer ranks reported than ran (the others counted as equally fast)."""
    hosts: list[str] = field(default_factory=list)
    """Host of each reporting rank, in rank order."""
    lockstep_items_per_second: float | None = None
    """Independent copies only: their throughput had every step waited for that step's slowest copy."""
    epochs: float | None = None
    """Epochs in the reported seconds (a script reporting ``epoch=k`` lines or ``epochs=E``)."""
    rank_spread: float | None = None
    """(max - min) / median of the reporting ranks' own items/s: ranks that disagree make a run unsteady."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Measurement:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in body.items() if k in known})


def combine_reports(m: Measurement, reports: list[dict[str, Any]]) -> None:
    """Fill ``m``'s throughput fields from its ranks' report lines (one per rank: ``merge_rank_reports``)."""
    m.reports = merge_rank_reports(reports)
    m.ranks_reported = len(m.reports)
    m.hosts = [str(b.get("host", "")) for b in m.reports]
    usable = [b for b in m.reports if isinstance(b.get("items"), int | float) and
              isinstance(b.get("seconds"), int | float) and b["seconds"] > 0]
    if not usable:
        return
    world = max([m.np, *(int(b.get("world_size", 1)) for b in usable)])
    items = sum(float(b["items"]) for b in usable)
    if len(usable) < world:
        items = items / len(usable) * world
        m.extrapolated = True
    m.items = items
    m.seconds = max(float(b["seconds"]) for b in usable)
    m.items_per_second = items / m.seconds
    steps = [int(b["steps"]) for b in usable if b.get("steps")]
    if steps:
        m.steps = min(steps)
        m.seconds_per_step = m.seconds / m.steps
    per_epoch = [b["items_per_epoch"] for b in usable if b.get("items_per_epoch")]
    epochs = [float(b["epochs"]) for b in usable if _number(b.get("epochs")) and b["epochs"] > 0]
    if per_epoch and any(b.get("steps_per_epoch") for b in usable):
        m.seconds_per_epoch = float(per_epoch[0]) / m.items_per_second
    elif epochs:  # a script's own epochs: the slowest rank's time over them
        m.epochs = min(epochs)
        m.seconds_per_epoch = m.seconds / m.epochs
    if len(usable) > 1:
        rates = [float(b["items"]) / float(b["seconds"]) for b in usable]
        middle = statistics.median(rates)
        m.rank_spread = (max(rates) - min(rates)) / middle if middle > 0 else None
    if m.strategy == INDEPENDENT and not m.extrapolated:
        m.lockstep_items_per_second = lockstep_rate(usable)
    diverged = replicas_diverged(m.strategy, m.reports)
    if diverged and m.ok:
        m.status, m.error = "failed", diverged


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def merge_rank_reports(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per rank, in rank order.

    A rank's epoch lines (``"epoch": k``, one per epoch) are added up: items, seconds and steps summed,
    ``epochs`` their count, ``epoch_seconds`` each epoch's time (a repeated epoch number: its last line).
    Otherwise the rank's last line counts, as a line for the whole timed part.
    """
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for report in reports:
        by_rank.setdefault(int(report.get("rank", 0)), []).append(report)
    merged = []
    for rank in sorted(by_rank):
        lines = by_rank[rank]
        epochs = {int(b["epoch"]): b for b in lines
                  if _number(b.get("epoch")) and _number(b.get("items")) and _number(b.get("seconds"))}
        if not epochs:
            merged.append(lines[-1])
            continue
        body: dict[str, Any] = {}
        for line in lines:  # digests and other values a script sent on any line
            body.update(line)
        ordered = [epochs[k] for k in sorted(epochs)]
        body.pop("epoch", None)
        body["items"] = sum(float(b["items"]) for b in ordered)
        body["seconds"] = sum(float(b["seconds"]) for b in ordered)
        if all(_number(b.get("steps")) for b in ordered):
            body["steps"] = sum(int(b["steps"]) for b in ordered)
        else:
            body.pop("steps", None)
        body["epochs"] = len(ordered)
        body["epoch_seconds"] = [float(b["seconds"]) for b in ordered]
        merged.append(body)
    return merged


def replicas_diverged(strategy: str, reports: list[dict[str, Any]]) -> str | None:
    """Why a data-parallel run's speed does not count, when its ranks ended with different parameters.

    Averaged gradients are bit-identical on every rank, so the replicas of a working data-parallel
    strategy stay identical; one that skipped or botched the exchange would look fast for nothing.
    The references (independent copies, the barrier ranks) drift apart by design and are not checked.
    """
    if not is_competitor(strategy):
        return None
    digests = {b["parameters_digest"] for b in reports if b.get("parameters_digest")}
    if len(digests) <= 1:
        return None
    return (f"the {len(reports)} ranks ended with {len(digests)} different sets of parameters (digests "
            f"{', '.join(sorted(d[:12] for d in digests))}): the gradient exchange did not keep the replicas "
            "identical, so this run's speed does not count")


def lockstep_rate(reports: list[dict[str, Any]]) -> float | None:
    """Items/s of all ``reports``' processes had each step waited for that step's slowest process.

    Each process's own time (``seconds``) grows by what it would have waited: at every step that all
    of them timed (``step_seconds``), the slowest one's step less its own. Built on the measured
    times rather than on the sums of the listed ones (which the worker rounds to 10 us and caps in
    number), the ceiling can never pass the processes' own throughput.
    None unless at least two processes listed their step times and steps.
    """
    series: list[list[Any]] = []
    for body in reports:
        steps = body.get("step_seconds")
        if not (isinstance(steps, list) and steps and body.get("steps")):
            return None
        series.append(steps)
    if len(series) < 2:
        return None
    slowest = slowest_steps(series)
    lockstep = max(float(body["seconds"]) + sum(slow - float(own[k]) for k, slow in enumerate(slowest))
                   for body, own in zip(reports, series))
    items = sum(float(b["items"]) for b in reports)
    return items / lockstep if lockstep > 0 else None


def slowest_steps(series: Sequence[Sequence[float]]) -> list[float]:
    """Each step's slowest time across the processes, over the steps every process timed."""
    return [max(float(s[k]) for s in series) for k in range(min(len(s) for s in series))]


def lockstep_time(series: Sequence[Sequence[float]]) -> tuple[int, float]:
    """(steps, seconds) of the steps every process timed, had each waited for that step's slowest."""
    slowest = slowest_steps(series)
    return len(slowest), sum(slowest)


def step_times(runs: Sequence[Measurement]) -> list[float]:
    """Every timed step of every rank of ``runs`` (the reports' ``step_seconds``), pooled."""
    return [float(t) for m in runs for body in m.reports
            if isinstance(body.get("step_seconds"), list) for t in body["step_seconds"]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear between the closest ranks, as numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass
class Row:
    """One line of the table: a strategy at a process count, over its repeats."""

    strategy: str
    np: int
    runs: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    items_per_second: float | None = None
    """Median over the repeats that succeeded."""
    items_per_second_min: float | None = None
    items_per_second_max: float | None = None
    seconds_per_step: float | None = None
    step_seconds_p50: float | None = None
    """Median of every timed step of every rank in the repeats that succeeded (built-in workloads)."""
    step_seconds_p95: float | None = None
    """95th percentile of the same steps: a tail far above the median is a machine that jitters, which
    synchronous ranks pay at every step (docs/bench.md)."""
    seconds_per_epoch: float | None = None
    wall_seconds: float | None = None
    speedup: float | None = None
    """Throughput over the baseline's (or the baseline's wall time over this one's, without throughput)."""
    efficiency: float | None = None
    """Speedup / processes."""
    efficiency_min: float | None = None
    efficiency_max: float | None = None
    spread: float | None = None
    """(max - min) / median of the throughput (or of the wall time) over the repeats; None with fewer
    than two good repeats (``n/a`` in the table: nothing to compare)."""
    speedup_from: str = "throughput"
    """``throughput`` (items/s) or ``wall time`` (a script that reported nothing)."""
    model_efficiency: float | None = None
    """What the cost model predicts for this configuration (filled in when a link was measured)."""
    lockstep_efficiency: float | None = None
    """Independent copies: the efficiency a synchronous job with free communication reaches at best
    (median over the repeats of the lockstep throughput over the baseline's, per process)."""
    rank_spread: float | None = None
    """The largest spread between the ranks of one run (their own items/s), over the good repeats."""
    startup_seconds: float | None = None
    """A script that reported nothing: the measured start-up of the same command at this size."""
    net_wall_seconds: float | None = None
    """Wall time minus ``startup_seconds`` (median over the repeats): what the speedup compares then."""
    timed_seconds: float | None = None
    """The shortest timed part of the good repeats: the reported seconds (of the slowest rank), else
    the wall time minus start-up, else the wall time. Under ``SHORT_RUN_S``: ``too_short``."""
    method: str | None = None
    """How the row's gradients travel (``fp32``, ``fp16``, ``powersgd:4``, ``localsgd:8``), as its ranks
    reported it; None for the baseline, the references and a script."""
    wire_bytes_per_step: float | None = None
    """Bytes one rank handed to allreduces per optimizer step (Local SGD: one averaging's bytes over its
    steps), as its ranks reported them (``ringtrain.exchange.wire_cost``)."""
    compression_ratio: float | None = None
    """fp32 gradient bytes over ``wire_bytes_per_step``: how many times fewer bytes than fp32 gradients."""
    warmup_steps: int | None = None
    """The untimed steps its runs took (more than ``--warmup-steps`` for PowerSGD, whose first steps are
    uncompressed)."""
    steps: int | None = None
    """The timed steps of its runs (the fewest of the good repeats; Local SGD: whole averaging periods)."""

    @property
    def unsteady(self) -> bool:
        """True when the repeats, or the ranks of a run, disagree by more than ``SPREAD_WARNING``."""
        return any(v is not None and v > SPREAD_WARNING for v in (self.spread, self.rank_spread))

    @property
    def too_short(self) -> bool:
        """True when a good repeat's timed part lasted under ``SHORT_RUN_S``: its speed is not trusted."""
        return self.timed_seconds is not None and self.timed_seconds < SHORT_RUN_S

    @property
    def status(self) -> str:
        if self.failed and self.failed == self.runs:
            return "failed"
        if self.failed:
            return f"{self.failed}/{self.runs} failed"
        return "ok"

    def as_dict(self) -> dict[str, Any]:
        body = asdict(self)
        body["status"] = self.status
        body["unsteady"] = self.unsteady
        body["too_short"] = self.too_short
        return body


def summarize(measurements: list[Measurement], startup: dict[int, float] | None = None) -> list[Row]:
    """Rows in sweep order: the baseline, then by process count and strategy.

    ``startup``: seconds of start-up by process count, measured for a script that reported nothing;
    rows without throughput then compare wall time minus it.
    """
    rows: dict[tuple[str, int], Row] = {}
    groups: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        key = (m.strategy, m.np)
        groups.setdefault(key, []).append(m)
        rows.setdefault(key, Row(m.strategy, m.np))
    for key, runs in groups.items():
        _fill(rows[key], runs, startup)
    base = rows.get((BASELINE, 1))
    if base is not None:
        for row in rows.values():
            _compare(row, base, groups[(row.strategy, row.np)])
    order = {s: i for i, s in enumerate(dict.fromkeys(m.strategy for m in measurements))}
    return sorted(rows.values(), key=lambda r: (r.strategy != BASELINE, r.np, order[r.strategy]))


def _fill(row: Row, runs: list[Measurement], startup: dict[int, float] | None) -> None:
    """A row's own figures from its runs (medians, spreads, wall times net of start-up)."""
    row.runs = len(runs)
    good = [m for m in runs if m.ok]
    row.failed = row.runs - len(good)
    row.errors = [f"{m.strategy} np={m.np} #{m.repeat + 1}: {m.error}" for m in runs if not m.ok]
    rates = [m.items_per_second for m in good if m.items_per_second is not None]
    if rates:
        row.items_per_second = statistics.median(rates)
        row.items_per_second_min, row.items_per_second_max = min(rates), max(rates)
        # one repeat has no spread to give: None (n/a in the table), not a 0 that reads as steady
        row.spread = (max(rates) - min(rates)) / row.items_per_second if len(rates) > 1 else None
    row.seconds_per_step = _median([m.seconds_per_step for m in good if m.seconds_per_step])
    steps = step_times(good)
    if steps:
        row.step_seconds_p50, row.step_seconds_p95 = percentile(steps, 50), percentile(steps, 95)
    row.seconds_per_epoch = _median([m.seconds_per_epoch for m in good if m.seconds_per_epoch])
    walls = [m.wall_seconds for m in good if m.wall_seconds is not None]
    row.wall_seconds = _median(walls)
    spreads = [m.rank_spread for m in good if m.rank_spread is not None]
    row.rank_spread = max(spreads) if spreads else None
    if not rates and startup and startup.get(row.np) is not None:
        net = [w - startup[row.np] for w in walls]
        if net and min(net) > 0:  # a start-up as long as the run says nothing usable about it
            row.startup_seconds, walls = startup[row.np], net
            row.net_wall_seconds = statistics.median(net)
    if not rates and len(walls) > 1:
        row.spread = (max(walls) - min(walls)) / statistics.median(walls)
    # without reports, the timed part is what the speedup compares: wall time (net when measured)
    timed = [m.seconds for m in good if m.seconds is not None] if rates else walls
    row.timed_seconds = min(timed) if timed else None
    counts = [m.steps for m in good if m.steps]
    row.steps = min(counts) if counts else None
    _fill_wire(row, good)


def _fill_wire(row: Row, good: list[Measurement]) -> None:
    """The row's exchange as its ranks reported it (every rank and repeat of a row reports the same)."""
    for body in (b for m in good for b in m.reports):
        if body.get("method") is not None or body.get("wire_bytes_per_step") is not None:
            row.method = body.get("method")
            row.wire_bytes_per_step = body.get("wire_bytes_per_step")
            row.compression_ratio = body.get("compression_ratio")
            break
    warmups = [int(b["warmup_steps"]) for m in good for b in m.reports if _number(b.get("warmup_steps"))]
    row.warmup_steps = max(warmups) if warmups else None


def _compare(row: Row, base: Row, runs: list[Measurement]) -> None:
    """A row's speedup and efficiencies over the single-process baseline's figures."""
    if row.items_per_second is not None and base.items_per_second:
        row.speedup = row.items_per_second / base.items_per_second
        if row.items_per_second_min is not None and row.items_per_second_max is not None:  # set with it
            row.efficiency_min = row.items_per_second_min / base.items_per_second / row.np
            row.efficiency_max = row.items_per_second_max / base.items_per_second / row.np
    elif row.items_per_second is None and row.net_wall_seconds and base.net_wall_seconds:
        row.speedup = base.net_wall_seconds / row.net_wall_seconds
        row.speedup_from = "wall time minus start-up"
    elif row.items_per_second is None and row.wall_seconds and base.wall_seconds:
        row.speedup = base.wall_seconds / row.wall_seconds
        row.speedup_from = "wall time"
    if row.speedup is not None:
        row.efficiency = row.speedup / row.np
    if base.items_per_second:
        lockstep = [m.lockstep_items_per_second for m in runs
                    if m.ok and m.lockstep_items_per_second]
        if lockstep:
            row.lockstep_efficiency = statistics.median(lockstep) / base.items_per_second / row.np
