"""``ringtrain bench``: sweep process counts and strategies; print and write the scaling table.

Parses flags into a ``BenchSettings`` and hands it to ``ringtrain.bench.sweep.run_bench``; nothing else.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from ringtrain.cli.options import number as _float
from ringtrain.cli.options import whole_number as _int
from ringtrain.exceptions import UsageError


def register(subparsers: Any) -> None:
    """Add the ``bench`` subcommand."""
    from ringtrain.bench.plan import DEFAULT_STEPS, DEFAULT_WARMUP, STRATEGIES

    p = subparsers.add_parser(
        "bench", help="scaling table: time, items/s, speedup and efficiency against processes, with a plot",
        description="Run a built-in workload (or any program given after --) at several process counts "
                    "and strategies, interleaved and repeated, against a single-process baseline. Prints "
                    "an estimate of the sweep's duration first, then the table, and writes scaling.json, "
                    "scaling.csv and scaling.png to --out. A program is timed by what it reports "
                    "(ringtrain.bench.report, or RINGTRAIN_BENCH lines: steps or epochs), never its "
                    "start-up; one that reports nothing is timed by wall time minus its measured start-up, "
                    "and the table says so. Its one-process baseline runs with the horovod shim, as "
                    "ringtrain run's ranks do. See docs/bench.md.",
        epilog="examples:  ringtrain bench mnist --np 1,2,4 --steps 100\n"
               "           ringtrain bench synthetic --arch resnet18 --batch-size 32 --np 1,2 "
               "--strategies horovod,horovod-fp16,ddp,ddp-fp16\n"
               "           ringtrain bench synthetic --arch resnet18 --np 1,2 --project "
               "--strategies horovod,horovod-powersgd4,horovod-localsgd8   # which method pays\n"
               "           ringtrain bench --np 1,2 -- python examples/horovod_mnist.py --epochs 2\n"
               "           ringtrain bench mnist --np 1,2 --project --validate   # with the cost model\n"
               "           ringtrain bench --validate results/1gbit results/100mbit\n"
               "           ringtrain bench --replot bench-results/mnist   # redraw scaling.png, no runs",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", nargs="*", metavar="WORKLOAD | -- COMMAND ...",
                   help="a built-in workload (mnist, fashion-mnist, cifar10, movielens, synthetic, "
                        "synthetic-ratings), or the program to run after --")
    p.add_argument("--np", default="1,2", help="comma-separated process counts (1,2)")
    p.add_argument("--strategies", default="single,ddp,horovod",
                   help=f"competitors, comma-separated, from {', '.join(STRATEGIES)} (single,ddp,horovod); "
                        "ddp and horovod take a suffix for how gradients travel: -fp16, -bf16, -powersgd "
                        "(rank 4) or -powersgdR, -localsgdH (Local SGD, averaging every H steps), -dilocoH "
                        "(DiLoCo: outer lr 0.7, Nesterov momentum 0.9), e.g. horovod-powersgd4,ddp-powersgd4,"
                        "horovod-localsgd8,horovod-diloco8; the single-process baseline always runs; "
                        "independent and barrier are references that measure the machine (no communication "
                        "/ lockstep alone), not competitors")
    p.add_argument("--steps", type=_int, help=f"timed optimizer steps per run ({DEFAULT_STEPS})")
    p.add_argument("--epochs", type=_int, help="time whole epochs instead of --steps")
    p.add_argument("--warmup-steps", type=_int, default=DEFAULT_WARMUP,
                   help=f"untimed steps at the start of every run ({DEFAULT_WARMUP})")
    p.add_argument("--scaling", choices=("weak", "strong"), default="weak",
                   help="weak: --batch-size per process; strong: --batch-size split over the processes "
                        "(weak)")
    p.add_argument("--repeats", type=_int, default=3, help="runs of every configuration, interleaved (3)")
    p.add_argument("--batch-size", type=_int,
                   help="items per step (per process in weak scaling; workload default)")
    p.add_argument("--arch", help="model architecture of the workload (its default)")
    p.add_argument("--data-dir", help="folder holding the dataset files (default: built-in or cache)")
    p.add_argument("--subset", type=_int, help="keep at most N training items (seeded)")
    p.add_argument("--threads", type=_int,
                   help="torch threads of every process, baseline included (cores / largest local --np)")
    p.add_argument("--seed", type=_int, default=0, help="seed of data order and weights (0)")
    hosts = p.add_argument_group("hosts (as ringtrain run)")
    hosts.add_argument("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts and their slots")
    hosts.add_argument("--hostfile", metavar="FILE", help="file of 'host slots=N' lines")
    hosts.add_argument("-p", "--ssh-port", type=_int, help="ssh port of the remote hosts")
    hosts.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="ssh private key")
    hosts.add_argument("--network-interfaces", metavar="NIC,...", help="network interfaces for the ranks")
    hosts.add_argument("--start-timeout", type=_float, help="seconds allowed for reaching hosts and starting")
    out = p.add_argument_group("output and model")
    out.add_argument("--out", help="output folder (bench-results/WORKLOAD, or bench-results/SCRIPT for a "
                                   "script); one holding an earlier sweep is refused, see --overwrite")
    out.add_argument("--overwrite", action="store_true",
                     help="reuse an --out folder that holds an earlier sweep: remove its scaling.* files "
                          "and logs/ run logs first (nothing else in the folder)")
    out.add_argument("--replot", metavar="DIR",
                     help="instead of a sweep, redraw DIR/scaling.png from DIR/scaling.json and print its "
                          "table again")
    out.add_argument("--timeout", type=_float, default=1800.0,
                     help="seconds one run may take before it is stopped and marked failed (1800)")
    out.add_argument("--project", action="store_true",
                     help="add the cost model's projection to 8..1,024 ranks on named interconnects (a "
                          "model, not a measurement; measures the link first)")
    out.add_argument("--no-link-probe", dest="link_probe", action="store_false",
                     help="do not measure the link even with --project or --validate (no model column, no "
                          "'measured' interconnect)")
    out.add_argument("--link-note", help="how the link was set up, kept in scaling.json (e.g. '1gbit tbf')")
    out.add_argument("--interconnect", action="append", default=[], metavar="NAME=GBIT:USEC",
                     help="add an interconnect to the projection, e.g. roce=100:3 (repeatable)")
    out.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar or lines")
    out.add_argument("--validate", nargs="*", metavar="DIR",
                     help="alone: put the cost model's efficiency beside every measured row and list its "
                          "error (measures the link first); with folders: instead of a sweep, compare the "
                          "model with the runs in these output folders")
    p.set_defaults(func=run_bench)


def _hosts(args: argparse.Namespace) -> tuple[Any, ...]:
    from ringtrain.bench.plan import HostSpec
    from ringtrain.launch.hosts import parse_hostfile, parse_hosts

    if args.hosts and args.hostfile:
        raise UsageError("-H and --hostfile were both given. HINT: list the hosts in one place only.")
    parsed = parse_hosts(args.hosts) if args.hosts else parse_hostfile(args.hostfile) if args.hostfile else ()
    return tuple(HostSpec(h.host, h.slots) for h in parsed)


def _launcher_options(args: argparse.Namespace) -> tuple[str, ...]:
    options: list[str] = []
    if args.ssh_port is not None:
        options += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        options += ["-i", args.ssh_identity_file]
    if args.network_interfaces:
        options += ["--network-interfaces", args.network_interfaces]
    if args.start_timeout is not None:
        options += ["--start-timeout", f"{args.start_timeout:g}"]
    return tuple(options)


def _check_command(command: list[str]) -> None:
    """Refuse a program that cannot start, before the sweep."""
    from ringtrain.workloads.registry import WORKLOADS

    program = command[0]
    if len(command) == 1 and "/" not in program and shutil.which(program) is None:
        raise UsageError(f"{program!r} is neither a built-in workload nor a program on PATH. HINT: use one "
                         f"of {', '.join(WORKLOADS)}, or give the program after --, e.g. "
                         "ringtrain bench --np 1,2 -- python train.py.")
    if shutil.which(program) is None and not os.path.isfile(program):
        raise UsageError(f"command not found: {program!r}. HINT: give a program on PATH or a path to it, "
                         "e.g. -- python train.py.")
    name = os.path.basename(program)
    if name.startswith("python") and len(command) > 1 and command[1].endswith(".py") \
            and not os.path.isfile(command[1]):
        raise UsageError(f"script not found: {command[1]!r} (in {os.getcwd()}). HINT: check the path of the "
                         "Python script to run.")


def run_bench(args: argparse.Namespace) -> int:
    """Build the settings from the flags and run the sweep (or the validation)."""
    from ringtrain.bench.model import parse_interconnect
    from ringtrain.bench.plan import BenchSettings, parse_np, parse_strategies
    from ringtrain.workloads.registry import WORKLOADS

    if args.replot is not None:
        return _replot(args)
    if args.validate:
        return _validate(args)
    validate = args.validate is not None  # --validate alone: the model beside this sweep's rows
    target = list(args.target)
    workload = target[0] if len(target) == 1 and target[0] in WORKLOADS else None
    if workload is None:
        if not target:
            raise UsageError("nothing to benchmark. HINT: name a workload (ringtrain bench mnist --np 1,2) "
                             "or a program after -- (ringtrain bench --np 1,2 -- python train.py).")
        if target[0] in WORKLOADS:
            raise UsageError(f"{' '.join(target)!r}: a workload takes no further words. HINT: put options "
                             "before or after it with dashes (--steps 50), or a program after --.")
        _check_command(target)
    try:
        interconnects = tuple(parse_interconnect(text) for text in args.interconnect)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    batch_size = args.batch_size
    if workload and args.scaling == "strong" and batch_size is None:
        from ringtrain.workloads import get_workload

        batch_size = get_workload(workload).defaults.batch_size  # the global batch, split over processes
    script = target[1] if len(target) > 1 and os.path.basename(target[0]).startswith("python") else target[0]
    name = workload or Path(script).stem
    settings = BenchSettings(
        workload=workload, command=() if workload else tuple(target), nps=parse_np(args.np),
        strategies=parse_strategies(args.strategies), steps=args.steps, epochs=args.epochs,
        warmup_steps=args.warmup_steps, scaling=args.scaling, repeats=args.repeats, arch=args.arch,
        batch_size=batch_size, data_dir=args.data_dir, subset=args.subset, threads=args.threads,
        hosts=_hosts(args), launcher_options=_launcher_options(args),
        out=Path(args.out or f"bench-results/{name}"), timeout_s=args.timeout, link_probe=args.link_probe,
        project=args.project, validate=validate,
        link_note=args.link_note, interconnects=interconnects, seed=args.seed, overwrite=args.overwrite,
        argv=tuple(sys.argv))
    from ringtrain.bench.sweep import run_bench as sweep

    return sweep(settings, progress=args.progress)


def _replot(args: argparse.Namespace) -> int:
    """``--replot DIR``: the plot and table of a finished sweep again, nothing run."""
    from ringtrain.bench.sweep import replot

    if args.target or args.validate is not None:
        extra = " ".join(args.target) if args.target else "--validate"
        raise UsageError(f"--replot {args.replot} redraws a finished sweep and runs nothing, so {extra!r} "
                         f"has no use with it. HINT: run ringtrain bench --replot {args.replot} alone.")
    return replot(Path(args.replot))


def _validate(args: argparse.Namespace) -> int:
    from ringtrain.bench.analysis import collect_validation
    from ringtrain.bench.outputs import validation_text, write_json
    from ringtrain.workloads.registry import WORKLOADS

    named = [p for p in args.validate if p in WORKLOADS and not Path(p).exists()]
    if named:
        raise UsageError(f"--validate {' '.join(args.validate)}: {named[0]!r} is a workload, not a folder of "
                         f"results. HINT: put --validate after the workload (ringtrain bench {named[0]} "
                         "--validate) to validate the model in this sweep, or give folders written by "
                         "ringtrain bench --out DIR.")

    entries = collect_validation([Path(p) for p in args.validate])
    if not entries:
        raise UsageError(f"--validate {' '.join(args.validate)}: no configuration there has both a measured "
                         "link and a measured efficiency. HINT: give folders of sweeps with more than one "
                         "process count and the link probe on.")
    print(validation_text(entries), end="")
    if args.out:
        errors = [abs(e["error"]) for e in entries]
        write_json({"schema": "ringtrain.bench.validation/1", "entries": entries,
                    "mean_absolute_error": sum(errors) / len(errors), "max_absolute_error": max(errors)},
                   Path(args.out) / "validation.json")
        print(f"wrote {Path(args.out) / 'validation.json'}")
    return 0
