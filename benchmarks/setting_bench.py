"""The 2-rank efficiency targets, and what one engine setting buys there.

Runs ``ringtrain bench WORKLOAD --np 1,2 --strategies single,independent,horovod,ddp`` once with each
of two values of one environment variable (``--setting VAR=A,B``), alternating which goes first,
``--repeats`` times. Each ``ringtrain bench`` call is one repeat with its own single-process
baseline, so every efficiency is against a baseline timed minutes earlier, and B against A is a ratio
of adjacent runs.

    python benchmarks/setting_bench.py       # RINGTRAIN_OVERLAP=on,auto; MNIST + ResNet-18, ~25 min
    python benchmarks/setting_bench.py --setting RINGTRAIN_CPU_ALLREDUCE=ring,auto --workloads resnet18
    python benchmarks/setting_bench.py --quick                  # smoke run

Output: ``benchmarks/results/setting_bench_<variable>_<cpu>_<date>-<time>.{json,md}``: per workload
and value the 2-process efficiency of horovod, ddp and independent (median and range over the
repeats), and horovod's throughput with B over A and over DDP (median of paired ratios, 95 %
bootstrap interval). Results of ``RINGTRAIN_OVERLAP=on,auto`` from before this script had its
``--setting`` option are named ``overlap_bench_*``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from paired import bootstrap_ci, pair_ratios
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    # name: ringtrain bench arguments, timed steps (full run)
    "mnist": (["mnist"], 200),
    "resnet18": (["synthetic", "--arch", "resnet18", "--batch-size", "32"], 20),
}
DEFAULT_SETTING = "RINGTRAIN_OVERLAP=on,auto"
STRATEGIES = ("independent", "horovod", "ddp")


def parse_setting(text: str) -> tuple[str, tuple[str, str]]:
    """``VAR=A,B`` -> (VAR, (A, B)); ValueError naming the text otherwise."""
    name, _, values = text.partition("=")
    parts = tuple(v.strip() for v in values.split(","))
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name.strip()) or len(parts) != 2 or not all(parts):
        raise ValueError(f"--setting {text!r}: expected VARIABLE=A,B, e.g. RINGTRAIN_CPU_ALLREDUCE=ring,auto")
    return name.strip(), (parts[0], parts[1])


def run_bench(workload: str, steps: int, variable: str, setting: str, out: Path) -> dict[str, Any]:
    """One ``ringtrain bench`` repeat with ``variable=setting``; returns its scaling.json."""
    args, _ = WORKLOADS[workload]
    argv = [sys.executable, "-m", "ringtrain", "bench", *args, "--np", "1,2", "--strategies",
            "single," + ",".join(STRATEGIES), "--steps", str(steps), "--repeats", "1", "--threads", "1",
            "--no-progress", "--no-link-probe", "--out", str(out)]
    env = {**os.environ, variable: setting}
    print(f"$ {variable}={setting} " + " ".join(argv[1:]), flush=True)
    result = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"ringtrain bench failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads((out / "scaling.json").read_text())


def two_process_rows(scaling: dict[str, Any]) -> dict[str, dict[str, float]]:
    """strategy -> {efficiency, items_per_second} of the 2-process rows that ran."""
    return {row["strategy"]: {"efficiency": row["efficiency"], "items_per_second": row["items_per_second"]}
            for row in scaling["rows"] if row["np"] == 2 and row["status"] == "ok"}


def _ratio(repeats: list[dict[str, Any]], ours: tuple[str, str], theirs: tuple[str, str]) -> dict[str, Any]:
    """Throughput of ``(setting, strategy)`` over another's, paired by repeat."""
    a = [r[ours[0]][ours[1]]["items_per_second"] for r in repeats]
    b = [r[theirs[0]][theirs[1]]["items_per_second"] for r in repeats]
    ratios = pair_ratios(a, b)
    low, high = bootstrap_ci(ratios)
    return {"median": statistics.median(ratios), "ci95": [low, high], "pairs": ratios}


def summarize(raw: dict[str, list[dict[str, Any]]], values: tuple[str, str]) -> dict[str, Any]:
    """Per workload: efficiencies per value and strategy, and the paired throughput ratios."""
    first, second = values
    summary: dict[str, Any] = {}
    for workload, repeats in raw.items():
        entry: dict[str, Any] = {"efficiency": {}, "ratios": {}}
        for setting in values:
            for strategy in STRATEGIES:
                values_of = [r[setting][strategy]["efficiency"] for r in repeats]
                entry["efficiency"][f"{strategy} ({setting})"] = {
                    "median": statistics.median(values_of), "min": min(values_of), "max": max(values_of)}

        ratios = entry["ratios"]
        ratios[f"horovod {second} / horovod {first}"] = _ratio(
            repeats, (second, "horovod"), (first, "horovod"))
        ratios[f"horovod {second} / ddp"] = _ratio(repeats, (second, "horovod"), (second, "ddp"))
        ratios[f"horovod {first} / ddp"] = _ratio(repeats, (first, "horovod"), (first, "ddp"))
        summary[workload] = entry
    return summary


def markdown(summary: dict[str, Any], machine: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# Setting benchmark, {args.variable}: {machine['date']}", "",
             f"Machine: {machine['cpu']}, {machine['usable_cores']} cores; torch {machine['torch']}, "
             f"ringtrain {machine['ringtrain']} ({machine['commit']}); {machine['os']}.", "",
             f"`benchmarks/setting_bench.py --setting {args.setting} --repeats {args.repeats}` (steps: "
             + ", ".join(f"{w} {s}" for w, s in args.steps.items()) + "). 2 processes x 1 thread on loopback "
             "against one plain process; each repeat is one `ringtrain bench` run per setting, adjacent, "
             "order alternating. Efficiency: median [min-max] over the repeats. Ratios: throughput, "
             "median of the per-repeat ratios [95 % bootstrap interval].", ""]
    for workload, entry in summary.items():
        lines += [f"## {workload}", "", f"| strategy ({args.variable}) | 2-process efficiency |",
                  "|---|---|"]
        for name, e in entry["efficiency"].items():
            lines.append(f"| {name} | {e['median']:.3f} [{e['min']:.3f}-{e['max']:.3f}] |")
        lines += ["", "| ratio | median [95 % CI] |", "|---|---|"]
        for name, r in entry["ratios"].items():
            lines.append(f"| {name} | {r['median']:.3f}x [{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}] |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", default=DEFAULT_SETTING, help="VARIABLE=A,B (default %(default)s)")
    parser.add_argument("--workloads", default="mnist,resnet18", help="comma-separated: mnist,resnet18")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mnist-steps", type=int, default=WORKLOADS["mnist"][1])
    parser.add_argument("--resnet-steps", type=int, default=WORKLOADS["resnet18"][1])
    parser.add_argument("--quick", action="store_true", help="smoke run: few steps, one repeat")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or args.repeats < 1:
        parser.error(f"--workloads takes {', '.join(WORKLOADS)} and --repeats at least 1 "
                     f"(got {args.workloads!r}, {args.repeats})")
    try:
        args.variable, args.values = parse_setting(args.setting)
    except ValueError as exc:
        parser.error(str(exc))
    if args.quick:
        args.repeats, args.mnist_steps, args.resnet_steps = 1, 20, 2
    args.steps = {"mnist": args.mnist_steps, "resnet18": args.resnet_steps}
    args.steps = {w: args.steps[w] for w in workloads}
    from ringtrain.bench.machine import describe_machine

    machine = describe_machine()
    raw: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            order = args.values if repeat % 2 == 0 else args.values[::-1]
            for workload in workloads:
                measured = {}
                for setting in order:
                    out = Path(scratch) / f"{workload}-{setting}-{repeat}"
                    scaling = run_bench(workload, args.steps[workload], args.variable, setting, out)
                    measured[setting] = two_process_rows(scaling)
                raw[workload].append(measured)
    summary = summarize(raw, args.values)
    text = markdown(summary, machine, args)
    print(text)
    write_results(args.out, f"setting_bench_{args.variable.lower()}", machine, text,
                  {"variable": args.variable, "values": list(args.values), "repeats": args.repeats,
                   "steps": args.steps, "raw": raw, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
