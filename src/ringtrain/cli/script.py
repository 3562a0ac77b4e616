"""``ringtrain script slurm|pbs|lsf|kubernetes``: print a job script or manifest that runs ``ringtrain run``.

Each scheduler takes its own words for where the job goes (Slurm: ``--partition``/``-p`` and
``--qos``/``-q``; PBS and LSF: ``--queue``/``-q``); another scheduler's word is refused with the right
one, and any unknown option exits 2 with a hint, like every other bad value (:class:`HelpfulParser`).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ringtrain.cli.usage import HelpfulParser
from ringtrain.exceptions import UsageError
from ringtrain.launch.scripts import MAIL_EVENTS, SIGNAL_BEFORE_S, JobScript, render

_SUBMIT = {"slurm": "sbatch job.sh", "pbs": "qsub job.sh", "lsf": "bsub < job.sh"}
_WHAT = {"slurm": "an sbatch script", "pbs": "a qsub script (PBS Pro, OpenPBS, Torque)",
         "lsf": "a bsub script (IBM Spectrum LSF)"}
#: Where-the-job-goes options another scheduler has: (flags, dest, the fix for this scheduler).
_NOT_PARTITIONS = "{s} has queues, not partitions. HINT: use --queue {v} (-q {v})."
_NO_QOS = "{s} has no QOS. HINT: choose a queue with --queue instead."
_FOREIGN = {
    "slurm": [(("--queue",), "queue",
               "Slurm calls its queues partitions. HINT: use --partition {v} (-p {v}); -q is Slurm's --qos."),
              (("--project", "-P"), "project", "Slurm charges accounts. HINT: use --account {v} (-A {v}).")],
    "pbs": [(("--partition", "-p"), "partition", _NOT_PARTITIONS), (("--qos",), "qos", _NO_QOS),
            (("--project", "-P"), "project", "PBS charges accounts. HINT: use --account {v} (-A {v})."),
            (("--signal-before",), "signal_before",
             "PBS sends no warning ahead of the walltime: its SIGTERM comes at the end, and SIGKILL the "
             "site's kill_delay later. HINT: leave out --signal-before; with --requeue the ranks snapshot on "
             "that SIGTERM (docs/preemption.md).")],
    "lsf": [(("--partition", "-p"), "partition", _NOT_PARTITIONS), (("--qos",), "qos", _NO_QOS)],
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``script`` subcommand, with one sub-command per scheduler."""
    parser = subparsers.add_parser(
        "script", help="print a Slurm, PBS or LSF job script, or a Kubernetes manifest, that runs a command "
                       "with ringtrain run",
        description="Print a job script for sbatch (Slurm), qsub (PBS) or bsub (LSF), or a manifest for "
                    "kubectl apply (kubernetes), that starts COMMAND on NODES x NPROC_PER_NODE ranks through "
                    "`ringtrain run`. Example: ringtrain script slurm --nodes 2 --nproc-per-node 4 --time "
                    "01:00:00 -- python3 train.py --epochs 5 > job.sh; sbatch job.sh")
    schedulers = parser.add_subparsers(dest="scheduler", metavar="SCHEDULER", required=True,
                                       parser_class=HelpfulParser)
    for name in ("slurm", "pbs", "lsf"):
        sub = schedulers.add_parser(name, help=f"print {_WHAT[name]}",
                                    description=f"Print {_WHAT[name]}; submit it with `{_SUBMIT[name]}`.")
        _add_options(sub, name)
        sub.set_defaults(func=run)
    _add_kubernetes(schedulers)


def _add_kubernetes(schedulers: argparse._SubParsersAction) -> None:
    from ringtrain.launch.k8s_manifests import KINDS

    sub = schedulers.add_parser(
        "kubernetes", help="print a Kubernetes manifest (TrainJob, PyTorchJob, MPIJob or JobSet)",
        description="Print a manifest for `kubectl apply -f` whose pods run `ringtrain run COMMAND`, reading "
                    "what the operator sets (docs/kubernetes.md). Example: ringtrain script kubernetes "
                    "--kind trainjob --nodes 2 --nproc-per-node 4 --image IMAGE --gpus-per-node 4 -- "
                    "python train.py > job.yaml")
    sub.add_argument("--kind", choices=KINDS, required=True,
                     help="trainjob (Kubeflow Trainer v2), pytorchjob (Training Operator v1), mpijob (MPI "
                          "Operator), jobset (JobSet)")
    sub.add_argument("--nodes", "-N", type=int, required=True, help="number of nodes (pods)")
    sub.add_argument("--nproc-per-node", dest="procs_per_node", type=int, required=True, help="ranks per pod")
    sub.add_argument("--image", required=True, help="container image with ringtrain and the program")
    sub.add_argument("--name", default="ringtrain", help="the job's name (default ringtrain)")
    sub.add_argument("--gpus-per-node", type=int, default=0, help="nvidia.com/gpu per pod (default none)")
    sub.add_argument("--cpu", help="CPU request per pod, e.g. 8")
    sub.add_argument("--memory", help="memory request per pod, e.g. 32Gi")
    sub.add_argument("--shm-size", help="size of /dev/shm per pod (default 2Gi per rank)")
    sub.add_argument("--secret-name", help="the Secret holding RINGTRAIN_JOB_SECRET (default NAME-secret)")
    sub.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                     help="the program every rank runs, after --")
    sub.set_defaults(func=run_kubernetes)


def run_kubernetes(args: argparse.Namespace) -> int:
    """Print the manifest."""
    from ringtrain.launch.k8s_manifests import KubernetesJob, render

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    try:
        job = KubernetesJob(kind=args.kind, nodes=args.nodes, nproc_per_node=args.procs_per_node,
                            image=args.image, command=tuple(command), name=args.name,
                            gpus_per_node=args.gpus_per_node, cpu=args.cpu, memory=args.memory,
                            shm_size=args.shm_size, secret_name=args.secret_name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(render(job))
    return 0


def _add_options(parser: argparse.ArgumentParser, scheduler: str) -> None:
    parser.add_argument("--nodes", "-N", type=int, required=True, help="number of nodes")
    parser.add_argument("--nproc-per-node", "--procs-per-node", dest="procs_per_node", type=int,
                        required=True, help="ranks per node")
    parser.add_argument("--time", "-t",
                        help="wall-clock limit, HH:MM:SS (e.g. 01:30:00; 48:00:00 is two days)")
    if scheduler == "slurm":
        parser.add_argument("--partition", "-p", dest="queue", help="partition to run in")
        parser.add_argument("--qos", "-q", dest="qos", help="quality of service")
    else:
        parser.add_argument("--queue", "-q", dest="queue", help="queue to submit to")
    project = ("--project", "-P") if scheduler == "lsf" else ()
    parser.add_argument("--account", "-A", *project, dest="account", help="account (LSF: project) to charge")
    parser.add_argument("--mail-user", metavar="ADDRESS", help="where the scheduler sends its mails")
    parser.add_argument("--mail-type", metavar="WHEN", default="",
                        help=f"comma-separated: {', '.join(MAIL_EVENTS)} "
                             "(default with --mail-user: end,fail)")
    parser.add_argument("--job-name", "-J", default="ringtrain", help="job name (default ringtrain)")
    parser.add_argument("--output", "-o",
                        help="output file (default: the scheduler's; Slurm ringtrain-%%j.out)")
    parser.add_argument("--cpus-per-proc", type=int, default=None,
                        help="CPU cores per rank (default: whole nodes, their cores divided by the ranks)")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default none)")
    parser.add_argument("--python", default=None,
                        help="interpreter with ringtrain installed, as the job finds it (default python3, "
                             "after --venv and --setup)")
    parser.add_argument("--venv", metavar="DIR", help="activate this virtual environment first")
    parser.add_argument("--setup", action="append", default=[], metavar="LINE",
                        help="shell line to run before the launch, e.g. 'module load cuda' (repeatable)")
    parser.add_argument("--requeue", action="store_true",
                        help="take the scheduler's warning signal to the ranks (they snapshot and stop, "
                             "status 75), then requeue the job, which resumes from the snapshot "
                             "(docs/preemption.md)")
    if scheduler != "pbs":  # PBS has no warning ahead of the walltime: its SIGTERM comes at the end
        parser.add_argument("--signal-before", type=int, default=SIGNAL_BEFORE_S, metavar="SECONDS",
                            help=f"with --requeue: the warning comes this long before the time limit "
                                 f"(default {SIGNAL_BEFORE_S})")
    if scheduler == "pbs":
        parser.add_argument("--pbs-resources", choices=["select", "nodes"], default="select",
                            help="select=N:ncpus:mpiprocs with place=scatter (PBS Pro, default) or "
                                 "nodes=N:ppn (Torque)")
    for flags, dest, _fix in _FOREIGN[scheduler]:
        parser.add_argument(*flags, dest="foreign_" + dest, help=argparse.SUPPRESS)
    # dest "program" keeps the command separate from the subcommand name (args.subcommand).
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program every rank runs, after --")


def job_from_args(args: argparse.Namespace) -> JobScript:
    """Turn parsed flags into a validated :class:`JobScript`; bad values raise :class:`UsageError`."""
    for flags, dest, fix in _FOREIGN[args.scheduler]:
        value = getattr(args, "foreign_" + dest, None)
        if value is not None:
            name = args.scheduler.upper() if args.scheduler != "slurm" else "Slurm"
            raise UsageError(f"{flags[0]} {value!r}: {fix.format(s=name, v=shlex.quote(value))}")
    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    setup = list(args.setup)
    if args.venv:
        setup.insert(0, f". {shlex.quote(args.venv.rstrip('/'))}/bin/activate")
    mail_type = tuple(word.strip().lower() for word in args.mail_type.split(",") if word.strip())
    try:
        return JobScript(scheduler=args.scheduler, nodes=args.nodes, procs_per_node=args.procs_per_node,
                         command=tuple(command), time=args.time, queue=args.queue,
                         qos=getattr(args, "qos", None), account=args.account, mail_user=args.mail_user,
                         mail_type=mail_type, job_name=args.job_name, output=args.output,
                         cpus_per_proc=args.cpus_per_proc, gpus_per_node=args.gpus_per_node,
                         python=args.python or "python3", setup=tuple(setup),
                         pbs_resources=getattr(args, "pbs_resources", "select"), requeue=args.requeue,
                         signal_before=getattr(args, "signal_before", SIGNAL_BEFORE_S))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Print the job script."""
    sys.stdout.write(render(job_from_args(args)))
    return 0
