"""From measurements to the model: its inputs, a prediction for every measured row, the projection.

The inputs come from the same sweep: the baseline's step time and backward share, the gradient
size its worker reported, and the link probe's latency and bandwidth. Each measured row then gets the
model's efficiency for its own configuration and way of exchanging gradients (fp32, fp16, PowerSGD,
Local SGD: each row's own method), which is how the model is validated; the projection applies it to
named interconnects at 8 to 1,024 ranks for every method among the competitors, and, with more than
one, says which of them the model finds fastest there (``method_that_pays``). The compute slow-down
``f`` of a measured row is, by preference:

- 1 / the efficiency of the ``barrier`` ranks at the same size (the same placement, in lockstep,
  exchanging 4 bytes a step: what running synchronously costs here before any gradient moves);
- 1 / the efficiency of ``independent`` copies at the same size when the sweep ran them on one host
  (what the machine loses with that many busy processes, measured; their lockstep efficiency where
  their step times give one, see :mod:`ringtrain.bench.records`);
- else ranks x threads / cores.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from ringtrain.bench.model import (
    DEFAULT_BACKWARD_SHARE,
    FP32,
    INTERCONNECTS,
    Interconnect,
    StepModel,
    method_that_pays,
    predict,
)
from ringtrain.bench.model import project as project_model
from ringtrain.bench.plan import BARRIER, BASELINE, INDEPENDENT, is_competitor, method_of
from ringtrain.bench.records import Measurement
from ringtrain.exchange import Method


def _machine(report: dict[str, Any]) -> str:
    """Which machine a rank ran on: its kernel's boot id (namespace hosts share one), else its host name."""
    return str(report.get("boot_id") or report.get("host", ""))


def on_one_machine(m: Measurement, machine: str | None = None) -> bool:
    """True when every rank of ``m`` that reported ran on one machine (``machine``, when given)."""
    machines = {_machine(r) for r in m.reports}
    return len(machines) == 1 and (machine is None or machines == {machine})


def oversubscription(m: Measurement) -> float:
    """CPU demand over supply on the busiest machine of a run: ranks x threads / cores (at least 1)."""
    per_host = Counter(_machine(r) for r in m.reports)
    worst = 1.0
    for host, ranks in per_host.items():
        sample = next(r for r in m.reports if _machine(r) == host)
        threads, cores = sample.get("threads"), sample.get("cores")
        if threads and cores:
            # with fewer reports than ranks (a script reporting on rank 0), assume the ranks spread evenly
            ranks = ranks if m.ranks_reported >= m.np else max(ranks, round(m.np / max(1, len(per_host))))
            worst = max(worst, ranks * threads / cores)
    return worst


def step_model(runs: list[Measurement], method: Method, strong: bool) -> StepModel | None:
    """The model's inputs from the baseline's runs for gradients exchanged by ``method`` (None when they do
    not say enough).

    The baseline lists its parameters' shapes, which give every method's bytes. Result files written
    before it did have only the gradient bytes: enough for fp32, fp16, bf16 and Local SGD; PowerSGD's
    ratio is then taken from what its own runs reported, else it has no model."""
    base = [m for m in runs if m.strategy == BASELINE and m.ok and m.seconds_per_step]
    if not base:
        return None
    compute = statistics.median(m.seconds_per_step for m in base if m.seconds_per_step)
    reports = [r for m in base for r in m.reports]
    grads = [r["gradient_bytes"] for r in reports if r.get("gradient_bytes")]
    if not grads:
        return None
    shares = []
    for r in reports:
        phases = r.get("phases")
        if isinstance(phases, dict) and all(phases.get(k) for k in ("forward", "backward", "optimizer")):
            shares.append(phases["backward"] / (phases["forward"] + phases["backward"] + phases["optimizer"]))
    share = statistics.median(shares) if shares else DEFAULT_BACKWARD_SHARE
    backward = compute * share
    shapes = next((r["parameter_shapes"] for r in reports if r.get("parameter_shapes")), None)
    if shapes:
        return StepModel.for_shapes(compute, backward, shapes, method, strong=strong)
    ratio = None
    if method.name == "powersgd":
        ratio = next((float(r["compression_ratio"]) for m in runs if m.ok for r in m.reports
                      if r.get("method") == method.label and r.get("compression_ratio")), None)
        if ratio is None:
            return None
    return StepModel(compute_s=compute, backward_s=backward, gradient_bytes=float(grads[0]), method=method,
                     wire_ratio=ratio, strong=strong)


def competing_methods(strategies: list[str]) -> list[Method]:
    """The methods of the sweep's competitors, each once, in the order of ``--strategies`` (fp32 for a
    script, whose exchange the bench does not know); fp32 alone when there is no competitor."""
    methods: dict[str, Method] = {}
    for name in strategies:
        if is_competitor(name):
            method = method_of(name) or FP32
            methods.setdefault(method.label, method)
    return list(methods.values()) or [FP32]


def link_applies(link: dict[str, Any] | None, m: Measurement) -> bool:
    """True when the probed link is the one run ``m`` communicated over."""
    if not link or link.get("error"):
        return False
    distinct = len(set(m.hosts)) if m.hosts else 1
    return (distinct > 1) == (link.get("kind") == "between hosts")


def annotate(body: dict[str, Any], extra: tuple[Interconnect, ...] = (), *, project: bool = True,
             validate: bool = True) -> None:
    """Add the model to a result body: inputs, each row's prediction and validation (``validate``),
    and the projection (``project``); a sweep asks for them with --validate and --project."""
    runs = [Measurement.from_dict(r) for r in body.get("runs", [])]
    strong = body.get("settings", {}).get("scaling") == "strong"
    link = body.get("link")
    methods = competing_methods(body.get("settings", {}).get("strategies")
                                or [r["strategy"] for r in body.get("rows", [])])
    inputs: dict[str, StepModel] = {}
    for method in [FP32, *methods]:
        model = step_model(runs, method, strong)
        if model is not None:
            inputs[method.label] = model
    body["model"] = None
    body["validation"] = []
    body["projection"] = []
    body["method_that_pays"] = []
    if FP32.label not in inputs:
        body["model"] = {"error": "no baseline step time and gradient size: the model needs a built-in "
                                  "workload, or a script reporting steps= and gradient_bytes="}
        return
    base = inputs[FP32.label]
    body["model"] = {"compute_s": base.compute_s, "backward_s": base.backward_s,
                     "backward_share": base.backward_s / base.compute_s,
                     "gradient_bytes": base.gradient_bytes,
                     "buckets": base.buckets, "strong_scaling": strong,
                     "link": {k: link.get(k) for k in ("alpha_s", "beta_bytes_per_s", "kind")}
                     if link and not link.get("error") else None,
                     "methods": {label: {"wire_bytes_per_exchange": m.wire_bytes, "ratio": m.ratio,
                                         "rounds_per_bucket": m.rounds, "steps_per_exchange": m.sync_every,
                                         "wire_bytes_per_step": m.wire_bytes_per_step}
                                 for label, m in inputs.items()}}
    # measured compute slow-down at each size: N copies without communication (the machine's ceiling),
    # which applies to runs whose N ranks all shared the machine the copies ran on. The copies' lockstep
    # efficiency, where their step times gave one, is the ceiling of a synchronous job: it also pays
    # for the slower copy and the jitter of every step.
    ceiling = {r["np"]: r.get("lockstep_efficiency") or r["efficiency"] for r in body.get("rows", [])
               if r["strategy"] == INDEPENDENT and r.get("efficiency")}
    copies_on = next((_machine(m.reports[0]) for m in runs
                      if m.strategy == INDEPENDENT and m.ok and m.reports), None)
    # the barrier ranks ran where every other launched run did: their efficiency applies as it stands
    lockstep = {r["np"]: r["efficiency"] for r in body.get("rows", [])
                if r["strategy"] == BARRIER and r.get("efficiency")}
    for row in body.get("rows", []) if validate else []:
        if not is_competitor(row["strategy"]) or row.get("efficiency") is None:
            continue
        members = [m for m in runs if m.strategy == row["strategy"] and m.np == row["np"] and m.ok]
        members = [m for m in members if link_applies(link, m)]
        if not members:
            continue
        if row["np"] in lockstep:
            f, source = max(1.0, 1.0 / lockstep[row["np"]]), BARRIER
        elif row["np"] in ceiling and all(on_one_machine(m, copies_on) for m in members):
            f, source = max(1.0, 1.0 / ceiling[row["np"]]), "independent"
        else:
            f, source = statistics.median(oversubscription(m) for m in members), "cores"
        model = inputs.get((method_of(row["strategy"]) or FP32).label)
        if model is None:  # PowerSGD in a result file that lists neither shapes nor its ratio
            continue
        assert link is not None
        pred = predict(model, row["np"], link["alpha_s"], link["beta_bytes_per_s"], oversubscription=f)
        row["model_efficiency"] = pred.efficiency
        body["validation"].append({
            "strategy": row["strategy"], "method": model.method.label, "np": row["np"], "oversubscription": f,
            "compute_factor_from": source,
            "measured_efficiency": row["efficiency"], "predicted_efficiency": pred.efficiency,
            "error": pred.efficiency - row["efficiency"],
            "relative_error": (pred.efficiency - row["efficiency"]) / row["efficiency"],
            "measured_step_s": row.get("seconds_per_step"), "predicted_step_s": pred.step_s,
            "link": (link or {}).get("note") or (link or {}).get("kind")})
    if not project:
        return
    connects = list(INTERCONNECTS) + list(extra)
    if link and not link.get("error"):
        connects.append(Interconnect("measured", f"this sweep's link ({link.get('kind')})",
                                     link["beta_bytes_per_s"], link["alpha_s"]))
    projected = [inputs[m.label] for m in methods if m.label in inputs]
    for model in projected:
        body["projection"] += project_model(model, tuple(connects))
    if len(projected) > 1:
        body["method_that_pays"] = method_that_pays(projected, connects)


def collect_validation(paths: list[Path]) -> list[dict[str, Any]]:
    """The validation entries of several sweeps' scaling.json files (or the folders holding them)."""
    import json

    from ringtrain.exceptions import UsageError

    entries = []
    for path in paths:
        file = path / "scaling.json" if path.is_dir() else path
        try:
            body = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--validate {path}: cannot read {file} ({exc}). HINT: give folders written by "
                             "ringtrain bench --out DIR.") from None
        annotate(body)  # again: the model may have changed since the sweep was written
        workload = body.get("settings", {}).get("workload") or "script"
        link = body.get("link") or {}
        label = link.get("note") or link.get("kind") or "?"
        entries += [{**e, "workload": workload, "link": label, "source": str(file)}
                    for e in body["validation"]]
    return entries
