"""`ringtrain bench` across shaped links: where fp16 compression, fusion and overlap pay off.

Two hosts of our own (network namespaces ``hostA`` and ``hostB`` with sshd, from
``tests/integration/netns.py``) are joined by a link shaped with ``tc tbf`` to 10 Gbit/s, 1 Gbit/s and
100 Mbit/s, each with added latency (this kernel has no ``netem``: a forwarding process holds every
frame, see ``tests/integration/delay_link.py``). On each link, ``ringtrain bench`` runs on hostA with
``-H hostA:1,hostB:1`` (rank 1 on hostB over ssh) for the MNIST CNN and a CIFAR-shaped ResNet-18
(synthetic 3x32x32 data, batch 32), comparing ringtrain's Horovod strategy with and without fp16
compression against torch DDP with and without its fp16 comm hook, all against one plain process.
A local sweep (loopback, 1 to 4 ranks: 3 and 4 oversubscribe 2 cores) adds the 2-rank efficiency
and more configurations to check the cost model against. Every sweep measures its link first.

Needs root, ``ip``, ``tc``, ``sshd`` (as the integration tests). Run it on a quiet machine::

    sudo .venv/bin/python benchmarks/link_sweep.py            # about 1-2 hours on 2 cores
    sudo .venv/bin/python benchmarks/link_sweep.py --quick    # smoke run: a few steps, one repeat

Results: ``benchmarks/results/link_sweep_<cpu>_<date>/``: one ``ringtrain bench`` output folder per
(link, workload) with its scaling.json/.csv/.png, ``summary.md`` (the tables, the fp16 and Horovod/DDP
ratios with 95 % bootstrap intervals over the interleaved repeats, the model's validation) and
``summary.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.integration.netns: the namespace hosts of the integration tests

from paired import bootstrap_ci, pair_ratios  # noqa: E402

WORKLOADS = {
    # name: ringtrain bench arguments, timed steps (full run)
    "mnist": (["mnist"], 200),
    "resnet18": (["synthetic", "--arch", "resnet18", "--batch-size", "32"], 20),
}
LINKS = {"10gbit": "10 Gbit/s", "1gbit": "1 Gbit/s", "100mbit": "100 Mbit/s"}
#: The ratios summary.md gives where both sides ran: (ours, theirs).
COMPARISONS = (("horovod-fp16", "horovod"), ("horovod", "ddp"), ("horovod-fp16", "ddp-fp16"),
               ("horovod-powersgd4", "ddp-powersgd4"), ("horovod-powersgd4", "horovod"),
               ("ddp-powersgd4", "ddp"), ("horovod-localsgd8", "horovod"), ("horovod-diloco8", "horovod"))
#: The slow-link methods against uncompressed gradients (issue 39): --strategies slow-links.
SLOW_LINKS = "horovod,horovod-powersgd4,ddp-powersgd4,ddp,horovod-localsgd8"
#: independent: two plain copies on hostA, which shares its cores with hostB (one kernel): what the
#: machine loses with both cores busy, without any communication
STRATEGIES = "independent,barrier,horovod,horovod-fp16,ddp,ddp-fp16"


def bench_argv(workload: str, steps: int, warmup: int, repeats: int, out: Path,
               extra: list[str]) -> list[str]:
    args, _ = WORKLOADS[workload]
    return [sys.executable, "-m", "ringtrain", "bench", *args, "--steps", str(steps), "--warmup-steps",
            str(warmup), "--repeats", str(repeats), "--threads", "1", "--out", str(out), "--no-progress",
            "--project", "--validate", *extra]


def run_logged(argv: list[str], log: Path, timeout: float) -> int:
    """Run ``argv`` with its output in ``log`` (and echoed), returning its exit code."""
    print("$ " + " ".join(argv), flush=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                                env=_env())
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write("    " + line)
        return proc.wait(timeout=timeout)


def _env() -> dict[str, str]:
    from tests.integration.system import clean_env

    return clean_env()


def sweep_link(link: str, delay_ms: float, workloads: list[str], steps: dict[str, int], warmup: int,
               repeats: int, out: Path, strategies: str = STRATEGIES) -> dict[str, Any]:
    """Start the two hosts on a shaped link, bench every workload across them, stop the hosts."""
    from tests.integration.netns import NamespaceHosts

    root = Path(tempfile.mkdtemp(prefix=f"link-sweep-{link}-"))
    hosts = NamespaceHosts(root, bandwidth=link, delay_ms=delay_ms)
    note = f"{LINKS[link]} tbf + {delay_ms:g} ms delay"
    results: dict[str, Any] = {"link": link, "delay_ms": delay_ms, "note": note, "runs": {}}
    try:
        hosts.start()
        for workload in workloads:
            folder = out / link / workload
            argv = hosts.command("hostA", bench_argv(
                workload, steps[workload], warmup, repeats, folder,
                ["--np", "1,2", "--strategies", strategies, "-H", "hostA:1,hostB:1", "-i", str(hosts.key),
                 "--start-timeout", "120", "--link-note", note]))
            folder.mkdir(parents=True, exist_ok=True)
            results["runs"][workload] = run_logged(argv, folder / "bench.log", timeout=6 * 3600)
    finally:
        hosts.stop()
        results["forwarder"] = hosts.forwarder_stats()
        shutil.rmtree(root, ignore_errors=True)
    return results


def sweep_local(workloads: list[str], steps: dict[str, int], warmup: int, repeats: int,
                out: Path) -> dict[str, Any]:
    """Loopback on this machine: 1-4 processes (3 and 4 oversubscribe a 2-core machine)."""
    results: dict[str, Any] = {"link": "local", "note": "loopback on one machine", "runs": {}}
    for workload in workloads:
        folder = out / "local" / workload
        folder.mkdir(parents=True, exist_ok=True)
        argv = bench_argv(workload, steps[workload], warmup, repeats, folder,
                          ["--np", "1,2,3,4", "--strategies", STRATEGIES,
                           "--link-note", "loopback"])
        results["runs"][workload] = run_logged(argv, folder / "bench.log", timeout=6 * 3600)
    return results


def paired(body: dict[str, Any], ours: str, theirs: str, np: int = 2) -> dict[str, Any] | None:
    """Throughput of ``ours`` over ``theirs`` in the same repeats (adjacent runs): median and 95 % CI."""
    def rates(strategy: str) -> dict[int, float]:
        return {r["repeat"]: r["items_per_second"] for r in body["runs"]
                if r["strategy"] == strategy and r["np"] == np and r["status"] == "ok"
                and r["items_per_second"]}

    a, b = rates(ours), rates(theirs)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    ratios = pair_ratios([a[i] for i in common], [b[i] for i in common])
    low, high = bootstrap_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
    return {"ours": ours, "theirs": theirs, "np": np, "median": statistics.median(ratios), "low": low,
            "high": high, "pairs": len(ratios)}


def summarize(out: Path, sweeps: list[dict[str, Any]], machine: dict[str, Any],
              args: argparse.Namespace) -> str:
    """summary.md: per (link, workload) the table, the comparisons the issue asks for, the validation."""
    from ringtrain.bench.analysis import collect_validation
    from ringtrain.bench.outputs import table_text, validation_text

    lines = [f"# Link sweep: {machine.get('date', '')}", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores; torch {machine.get('torch')}, "
             f"ringtrain {machine.get('ringtrain')} ({machine.get('commit')}); {machine.get('os')}.",
             f"Command: `{' '.join(['benchmarks/link_sweep.py', *sys.argv[1:]])}`; "
             f"{args.repeats} interleaved repeat(s) per configuration, 1 thread per process.", "",
             "Ratios: throughput over the competitor's in the same repeat (runs adjacent in the sweep), "
             "median [95 % bootstrap interval].", ""]
    comparisons = []
    folders = []
    for sweep in sweeps:
        for workload in sweep["runs"]:
            folder = out / sweep["link"] / workload
            file = folder / "scaling.json"
            if not file.exists():
                lines += [f"## {sweep['link']}, {workload}: no scaling.json (see {folder / 'bench.log'})", ""]
                continue
            folders.append(folder)
            body = json.loads(file.read_text())
            lines += [f"## {sweep['link']}, {workload}", "", "```", table_text(body).rstrip(), "```", "",
                      f"![{sweep['link']} {workload}]({folder.relative_to(out) / 'scaling.png'})", ""]
            for ours, theirs in COMPARISONS:
                found = paired(body, ours, theirs)
                if found:
                    comparisons.append({"link": sweep["link"], "workload": workload, **found})
        if sweep.get("forwarder"):
            fw = sweep["forwarder"]
            lines += [f"Delay forwarder on {sweep['link']}: {sum(fw['frames'])} frames, "
                      f"{sum(fw['bytes']) / 1e9:.2f} GB, {fw['cpu_seconds']:.1f} CPU seconds over the link's "
                      "whole sweep.", ""]
    if comparisons:
        lines += ["## Comparisons at 2 processes", "", "| link | workload | ratio | median [95 %] | pairs |",
                  "|---|---|---|---|---|"]
        for c in comparisons:
            lines.append(f"| {c['link']} | {c['workload']} | {c['ours']} / {c['theirs']} | "
                         f"{c['median']:.3f}x [{c['low']:.3f}-{c['high']:.3f}] | {c['pairs']} |")
        lines.append("")
    validation = collect_validation(folders) if folders else []
    if validation:
        lines += ["## The cost model against every measured configuration", "", "```",
                  validation_text(validation).rstrip(), "```", ""]
    (out / "summary.json").write_text(json.dumps({"machine": machine, "sweeps": sweeps,
                                                  "comparisons": comparisons, "validation": validation},
                                                 indent=1, default=str) + "\n")
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def relative_paths(out: Path) -> None:
    """Rewrite this checkout's absolute path as relative in every text file under ``out``: the logs and
    JSON name the interpreter and the output folders, and committed results must not carry one
    machine's paths."""
    prefix = f"{ROOT}/"
    for file in out.rglob("*"):
        if file.suffix in {".png", ".gz"} or not file.is_file():
            continue
        text = file.read_text(errors="replace")
        if prefix in text:
            file.write_text(text.replace(prefix, ""))


def check_system() -> str | None:
    """Why the sweep cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc, TAP devices). HINT: run it with sudo."
    missing = [c for c in ("ip", "tc", "sshd", "ssh", "ssh-keygen", "unshare")
               if not (shutil.which(c) or shutil.which(c, path="/usr/sbin:/sbin"))]
    if missing:
        return f"missing {', '.join(missing)}. HINT: sudo bash .ci/system-setup installs them."
    if not Path("/dev/net/tun").exists():
        return "no /dev/net/tun (TAP devices carry the delayed link). HINT: modprobe tun."
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", default="10gbit,1gbit,100mbit", help="tbf rates, comma-separated")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="added one-way latency (1 ms)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"subset of {list(WORKLOADS)}")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats per configuration (3)")
    parser.add_argument("--mnist-steps", type=int, help=f"timed steps, MNIST ({WORKLOADS['mnist'][1]})")
    parser.add_argument("--resnet-steps", type=int,
                        help=f"timed steps, ResNet-18 ({WORKLOADS['resnet18'][1]})")
    parser.add_argument("--no-local", dest="local", action="store_false", help="skip the loopback sweep")
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 steps, 1 repeat")
    parser.add_argument("--out", help="results folder (benchmarks/results/link_sweep_<cpu>_<date>)")
    parser.add_argument("--strategies", default=STRATEGIES,
                        help=f"ringtrain bench --strategies across the link ({STRATEGIES}); 'slow-links': "
                             f"{SLOW_LINKS}")
    parser.add_argument("--resnet-batch", type=int, default=32,
                        help="ResNet-18's items per step and rank (32); a smaller batch computes for less "
                             "time per step, as a GPU would, so that the link's share of a step grows")
    parser.add_argument("--warmup-steps", type=int, default=5,
                        help="warm-up steps per run (5; PowerSGD's runs take at least 12)")
    args = parser.parse_args(argv)
    if args.strategies == "slow-links":
        args.strategies = SLOW_LINKS
    problem = check_system()
    if problem:
        print(f"link_sweep: {problem}", file=sys.stderr)
        return 2
    links = [link for link in args.links.split(",") if link]
    unknown = [link for link in links if link not in LINKS]
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown or any(w not in WORKLOADS for w in workloads):
        parser.error(f"links must come from {list(LINKS)}, workloads from {list(WORKLOADS)}")
    WORKLOADS["resnet18"] = (["synthetic", "--arch", "resnet18", "--batch-size", str(args.resnet_batch)],
                             WORKLOADS["resnet18"][1])
    steps = {"mnist": args.mnist_steps or WORKLOADS["mnist"][1],
             "resnet18": args.resnet_steps or WORKLOADS["resnet18"][1]}
    warmup = args.warmup_steps
    if args.quick:
        steps, warmup, args.repeats = {"mnist": 3, "resnet18": 2}, 1, 1
    from ringtrain.bench.machine import describe_machine

    machine = describe_machine()
    slug = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-")[:40]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M")
    out = Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"link_sweep_{slug}_{stamp}{'_quick' if args.quick else ''}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    sweeps = []
    if args.local:
        sweeps.append(sweep_local(workloads, steps, warmup, args.repeats, out))
    for link in links:
        sweeps.append(sweep_link(link, args.delay_ms, workloads, steps, warmup, args.repeats, out,
                                 args.strategies))
    print(summarize(out, sweeps, machine, args))
    relative_paths(out)
    print(f"link_sweep: {time.monotonic() - started:.0f} s; wrote {out / 'summary.md'}")
    failed = [(s["link"], w) for s in sweeps for w, code in s["runs"].items() if code != 0]
    if failed:
        print(f"link_sweep: some runs failed in {failed}; see bench.log and logs/ in their folders",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
