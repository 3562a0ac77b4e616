"""``ringtrain script slurm|pbs``: print a ready job script that runs a command through ``ringtrain run``."""

from __future__ import annotations

import argparse
import shlex
import sys

from ringtrain.cli.errors import UsageError
from ringtrain.launch.scripts import JobScript, render


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``script`` subcommand, with one sub-command per scheduler."""
    parser = subparsers.add_parser(
        "script", help="print a Slurm or PBS job script that runs a command with ringtrain run",
        description="Print a job script for sbatch (Slurm) or qsub (PBS) that starts COMMAND on "
                    "NODES x PROCS_PER_NODE ranks through `ringtrain run`. Example: ringtrain script slurm "
                    "--nodes 2 --procs-per-node 4 --time 01:00:00 -- python train.py --epochs 5 > job.sh; "
                    "sbatch job.sh")
    schedulers = parser.add_subparsers(dest="scheduler", metavar="SCHEDULER", required=True)
    for name, what in (("slurm", "an sbatch script"), ("pbs", "a qsub script (PBS Pro, OpenPBS, Torque)")):
        sub = schedulers.add_parser(name, help=f"print {what}")
        _add_options(sub)
        sub.set_defaults(func=run)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", "-N", type=int, required=True, help="number of nodes")
    parser.add_argument("--procs-per-node", "--nproc-per-node", dest="procs_per_node", type=int,
                        required=True, help="ranks per node")
    parser.add_argument("--time", "-t", help="wall-clock limit, HH:MM:SS")
    parser.add_argument("--partition", "--queue", "-p", dest="partition", help="Slurm partition / PBS queue")
    parser.add_argument("--job-name", "-J", default="ringtrain", help="job name (default ringtrain)")
    parser.add_argument("--account", "-A", help="account or project to charge")
    parser.add_argument("--output", "-o", help="output file (Slurm default ringtrain-%%j.out)")
    parser.add_argument("--cpus-per-proc", type=int, default=1, help="CPU cores per rank (default 1)")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default none)")
    parser.add_argument("--python", default=None,
                        help="interpreter with ringtrain installed (default: this one, "
                             "or `python` after --venv)")
    parser.add_argument("--venv", metavar="DIR", help="activate this virtual environment first")
    parser.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="shell line to run before the launch, e.g. 'module load cuda' (repeatable)")
    parser.add_argument("--pbs-resources", choices=["select", "nodes"], default="select",
                        help="PBS syntax: select=N:ncpus:mpiprocs (PBS Pro, default) or nodes=N:ppn (Torque)")
    # dest "program" keeps the command separate from the subcommand name (args.subcommand).
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program every rank runs, after --")


def job_from_args(args: argparse.Namespace) -> JobScript:
    """Turn parsed flags into a validated :class:`JobScript`; bad values raise :class:`UsageError`."""
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    setup = list(args.setup)
    if args.venv:
        setup.insert(0, f". {shlex.quote(args.venv.rstrip('/'))}/bin/activate")
    python = args.python or ("python" if args.venv else sys.executable)
    try:
        return JobScript(scheduler=args.scheduler, nodes=args.nodes, procs_per_node=args.procs_per_node,
                         command=tuple(command), time=args.time, partition=args.partition,
                         job_name=args.job_name, account=args.account, output=args.output,
                         cpus_per_proc=args.cpus_per_proc, gpus_per_node=args.gpus_per_node, python=python,
                         setup=tuple(setup), pbs_resources=args.pbs_resources)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Print the job script."""
    sys.stdout.write(render(job_from_args(args)))
    return 0
