"""``ringtrain train WORKLOAD``: train a built-in workload on one or more ranks.

Parses flags into a ``TrainJob`` and hands it to ``ringtrain.train.job.launch_job``; nothing else.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from ringtrain.cli.node_options import (
    NODE_DESTS,
    add_node_arguments,
    describe_sources,
    node_settings,
    value_label,
)
from ringtrain.cli.options import EnvFlag, EnvOption, hang_seconds, record_sources, spellings, value_source
from ringtrain.cli.options import number as _float
from ringtrain.cli.options import whole_number as _int
from ringtrain.cli.usage import option_strings
from ringtrain.exceptions import UsageError

WORKLOAD_CHOICES = ("mnist", "fashion-mnist", "cifar10", "movielens", "synthetic", "synthetic-ratings")


def register(subparsers: Any) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train", help="train a built-in workload (mnist, fashion-mnist, cifar10, movielens, synthetic)",
        description="Train a built-in workload data-parallel. With -np N > 1 the ranks are started "
                    "through `ringtrain run`. Defaults come from the workload.")
    p.add_argument("workload", choices=WORKLOAD_CHOICES, help="what to train")
    p.add_argument(*spellings("-np", "--num-proc"), dest="np", type=_int,
                   help="ranks on this machine (1); with several nodes, ranks in all")
    p.add_argument("--oversubscribe", action=EnvFlag,
                   help="run more threads (ranks x --threads) than this machine has cores without a warning")
    p.add_argument(*spellings("--max-restarts"), dest="max_restarts", action=EnvOption, torchrun=True,
                   type=_int, default="0",
                   help="restart every rank up to N times when one fails; training resumes from the last "
                        "snapshot (0)")
    p.add_argument(*spellings("--hang-timeout"), dest="hang_timeout", action=EnvOption, type=hang_seconds,
                   metavar="SECONDS", help="end a job whose ranks made no progress for this long, naming the "
                   "rank the others wait for (600 s when that rank is not busy; docs/failures.md)")
    p.add_argument(*spellings("--no-watch"), dest="no_watch", action=EnvFlag,
                   help="do not watch the ranks for a stuck or slow rank")
    run = p.add_argument_group("training")
    run.add_argument("--epochs", type=_int, help="epochs in total (workload default)")
    run.add_argument(*spellings("--batch-size"), type=_int,
                     help="items per batch on each rank (workload default)")
    run.add_argument("--lr", type=_float, help="learning rate of one rank (workload default)")
    run.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), help="optimizer (workload default)")
    run.add_argument("--momentum", type=_float, help="SGD momentum (workload default)")
    run.add_argument(*spellings("--weight-decay"), type=_float, help="L2 penalty (workload default)")
    run.add_argument("--arch", help="model architecture of the workload (its default)")
    run.add_argument("--strategy", choices=("ddp", "horovod"),
                     help="DistributedDataParallel or ringtrain's Horovod DistributedOptimizer (ddp; horovod "
                          "in elastic mode)")
    run.add_argument(*spellings("--fp16-allreduce"), action="store_true",
                     help="send gradients as float16 (as --compression fp16)")
    run.add_argument("--compression", metavar="METHOD", default="none",
                     help="how gradients travel: none, fp16, bf16, powersgd[:RANK] (low rank with error "
                          "feedback, rank 4), or auto (chosen from the measured link; docs/slow-links.md) "
                          "(none)")
    run.add_argument(*spellings("--sync-every"), type=_int, metavar="H",
                     help="Local SGD: each rank steps on its own gradients and the ranks average every H "
                          "steps (with --outer-lr/--outer-momentum: DiLoCo)")
    run.add_argument(*spellings("--outer-lr"), type=_float, default=1.0,
                     help="Local SGD's outer learning rate on the averaged change (1: plain averaging)")
    run.add_argument(*spellings("--outer-momentum"), type=_float, default=0.0,
                     help="Local SGD's outer Nesterov momentum (0; DiLoCo: --outer-lr 0.7 "
                          "--outer-momentum 0.9)")
    run.add_argument(*spellings("--shard-optimizer"), action="store_true",
                     help="keep each parameter's optimizer state on one rank only (ZeRO stage 1)")
    run.add_argument(*spellings("--batches-per-allreduce"), type=_int, default=1,
                     help="micro-batches accumulated locally per allreduce and step (1)")
    run.add_argument("--amp", action="store_true", help="mixed precision (fp16 on CUDA, bf16 on CPU)")
    run.add_argument(*spellings("--scale-lr"), action="store_true",
                     help="multiply the lr by ranks x batches-per-allreduce (Goyal et al.)")
    run.add_argument(*spellings("--warmup-epochs"), type=_float, default=0.0,
                     help="ramp the scaled lr up linearly over this many epochs (needs --scale-lr)")
    run.add_argument("--seed", type=_int, default=0, help="seed of data order, subset choice and RNGs (0)")
    run.add_argument(*spellings("--eval-every"), type=_int, default=1, help="evaluate every N epochs (1)")
    run.add_argument(*spellings("--max-steps-per-epoch"), type=_int,
                     help="cut each epoch after N steps (quick trials)")
    run.add_argument("--device", choices=("cpu", "cuda"), help="device (CUDA when available)")
    run.add_argument("--threads", type=_int, help="torch threads per rank on CPU (cores / local ranks)")
    run.add_argument(*spellings("--num-workers"), type=_int, default=0,
                     help="DataLoader workers per rank (0)")
    el = p.add_argument_group("elastic (Horovod elastic: a failed worker costs the work since the last "
                              "commit, not the job; needs --strategy horovod)")
    el.add_argument(*spellings("--min-np"), type=_int, help="fewest workers to go on with (default -np)")
    el.add_argument(*spellings("--max-np"), type=_int,
                    help="most workers at once (default: every slot found)")
    el.add_argument(*spellings("--host-discovery-script"),
                    help="executable printing the available 'host:slots' lines (default: this machine, "
                         "-np slots)")
    data = p.add_argument_group("data")
    data.add_argument(*spellings("--data-dir"),
                      help="folder holding the dataset files (default: built-in or cache)")
    data.add_argument("--download", action="store_true", help="download missing files (md5 verified)")
    data.add_argument(*spellings("--cache-dir"), help="where downloads go")
    data.add_argument("--subset", type=_int, help="keep at most N items of each split (seeded)")
    data.add_argument("--like", choices=("mnist", "cifar10", "imagenet"),
                      help="synthetic only: images with the shape, classes and item counts of this data set "
                           "(default: CIFAR-shaped, 10,000 items)")
    snap = p.add_argument_group("snapshots")
    snap.add_argument(*spellings("--save-every"), type=_int,
                      help="snapshot every N epochs (1 when --snapshot-dir is given)")
    snap.add_argument(*spellings("--save-every-steps"), type=_int,
                      help="also snapshot every N optimizer steps")
    snap.add_argument(*spellings("--snapshot-dir"), help="snapshot folder, resumed from automatically "
                                             "(default with --save-every: ringtrain-snapshots/WORKLOAD)")
    snap.add_argument(*spellings("--keep-last"), type=_int, default=3, help="snapshots to keep (3)")
    snap.add_argument(*spellings("--sync-snapshots"), dest="sync_snapshots", action="store_true",
                      help="write each snapshot before training goes on (default: a writer process writes it "
                           "beside training; training waits only for a copy in memory)")
    snap.add_argument(*spellings("--no-resume"), dest="resume", action="store_false",
                      help="start afresh even if the snapshot folder holds snapshots")
    snap.add_argument(*spellings("--signals-to-handle"), default="SIGTERM,SIGUSR1",
                      help="signals that stop every rank after the same step with one snapshot; exit 75 "
                           "(comma-separated, '' for none; SIGTERM,SIGUSR1)")
    out = p.add_argument_group("output")
    out.add_argument(*spellings("--log-dir"), help="write metrics.csv (and TensorBoard events) here")
    out.add_argument(*spellings("--results-json"),
                     help="write the per-epoch results here as JSON (a metric that was not measured, "
                          "e.g. the accuracy of a regression, is null)")
    out.add_argument(*spellings("--no-progress"), dest="progress", action="store_false",
                     help="no progress bar")
    ray = p.add_argument_group("Ray (as ringtrain run --ray: one node agent per Ray node, as a Ray actor; "
                               "needs pip install 'ringtrain[ray]')")
    ray.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                     help="run the -np ranks on a Ray cluster: the head's HOST:PORT, ray://HOST:PORT, or "
                          "auto (RAY_ADDRESS, else the cluster `ray start` began here); each rank reserves "
                          "--threads CPUs (1). Paths (--data-dir, --snapshot-dir, --results-json, --log-dir) "
                          "are read and written on the ranks' nodes")
    nodes = p.add_argument_group("nodes (torchrun's flags; defaults also from its PET_<FLAG> variables, "
                                 "as in ringtrain run)")
    add_node_arguments(nodes, os.environ)
    record_sources(p)
    # the long flags, so that a TrainerConfig error can be told in the flags' own words
    flags = frozenset(o for o in option_strings(p) if o.startswith("--"))
    p.set_defaults(func=run_train, train_flags=flags)


#: A ``field=value`` of TrainerConfig's messages: a field name, then a quoted or a plain value.
_FIELD_VALUE = re.compile(r"\b([a-z][a-z0-9_]*)=('[^']*'|[^\s,;:)]+?)(?=[\s,;:)]|\.(?:\s|$)|$)")


#: Settings the command line makes from other flags, in the words of those flags.
_CLI_WORDS = {"elastic=True": "an elastic job (--min-np, --max-np or --host-discovery-script)"}


def as_flags(message: str, flags: frozenset[str]) -> str:
    """``epochs=3`` in a TrainerConfig message as the command line writes it, ``--epochs 3``.

    The Python API's messages name its fields; a user of ``ringtrain train`` typed flags. Fields with
    no flag of the same name are left as they are.
    """
    def flag_form(match: re.Match[str]) -> str:
        flag, value = "--" + match[1].replace("_", "-"), match[2].strip("'")
        if flag not in flags:
            return match[0]
        if value == "True":
            return flag
        if value in ("None", "False"):
            return f"no {flag}"
        return f"{flag} {value}"

    told = _FIELD_VALUE.sub(flag_form, message)
    for field, words in _CLI_WORDS.items():
        told = told.replace(field, words)
    # a message that already gave the flag in brackets now says it twice: "--x 1 (--x 1)"
    told = re.sub(r"(--[a-z0-9-]+(?: \S+)?) \(\1\)", r"\1", told)
    # "a whole number ... or None": None is the API's way of leaving a flag out
    return told.replace(" or None.", ", or left out.") if told != message else told


def node_launch(args: argparse.Namespace) -> dict[str, Any]:
    """torchrun's node settings that were set (flags, ``RINGTRAIN_*`` or ``PET_*``), for the launcher;
    those that came from variables are told on stderr.

    A rank that a launcher started (``ringtrain run ... ringtrain train``: it has ``TORCHELASTIC_RUN_ID``,
    or ``RINGTRAIN_ELASTIC_WORKER`` under the elastic driver) is placed already: it inherits the pod's
    ``PET_*`` but must not launch again, so it ignores them (and ``PET_MAX_RESTARTS``) and refuses node
    flags on its command line.
    """
    from ringtrain.engine import elastic_rendezvous

    marker = "TORCHELASTIC_RUN_ID" if "TORCHELASTIC_RUN_ID" in os.environ \
        else elastic_rendezvous.ENV_WORKER if elastic_rendezvous.enabled() else None
    if marker:
        given = [f"--{dest.replace('_', '-')}" for dest in NODE_DESTS
                 if value_source(args, dest) == "command line"] + (["--ray"] if args.ray is not None else [])
        if given:
            raise UsageError(f"{', '.join(given)}: this ringtrain train is a rank that a launcher started "
                             f"({marker} is set), placed on its node already. HINT: give the node flags to "
                             "the launcher (ringtrain run / torchrun), not to ringtrain train.")
        if value_source(args, "max_restarts") != "command line":
            args.max_restarts = 0  # the launcher restarts the ranks; a rank restarts nothing
        return {}
    # node rank 0 is a setting: compare by identity, not by truth
    settings = {name: value for name, value in node_settings(args).items()
                if value is not None and value is not False and value != {}}
    if not settings:
        return settings
    if args.min_np is not None or args.max_np is not None or args.host_discovery_script:
        named = ", ".join(f"{value_label(args, dest)}{getattr(args, dest)}" for dest in NODE_DESTS
                          if dest in settings)
        raise UsageError(f"{named} (torchrun's node settings) cannot be combined with --min-np/--max-np/"
                         "--host-discovery-script: the elastic driver places the workers itself. HINT: drop "
                         "the elastic flags, or unset the node settings.")
    # what the variables set (a pod's PET_*) is told: the command line shows the rest
    for line in describe_sources(args):
        if "(from default)" not in line and "(from command line)" not in line:
            print(f"ringtrain train: {line}", file=sys.stderr, flush=True)
    if args.np is not None:
        settings["num_proc"] = args.np
    return settings


def run_train(args: argparse.Namespace) -> int:
    """Build the job from the flags and run it."""
    from ringtrain.cli.train_checks import check_before_training
    from ringtrain.engine import elastic_rendezvous
    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.job import RankInputError, TrainJob, input_errors, launch_job
    from ringtrain.workloads import get_workload

    defaults = get_workload(args.workload).defaults
    nodes = node_launch(args)
    ray = None
    if args.ray is not None:
        from ringtrain.cli.run import ray_address
        from ringtrain.launch.prechecks import require_ray

        ray = ray_address(args.ray, f"ringtrain train {args.workload} --ray -np 2")
        require_ray()
    if args.max_restarts < 0:
        raise UsageError(f"{value_label(args, 'max_restarts')}{args.max_restarts} must be at least 0. "
                         "HINT: use e.g. --max-restarts 3, or 0 for no restart.")
    # Elastic: asked for here, or this is a worker of `ringtrain run --min-np ... ringtrain train ...`.
    elastic = (args.min_np is not None or args.max_np is not None or args.host_discovery_script is not None
               or elastic_rendezvous.enabled())
    strategy = args.strategy or ("horovod" if elastic else "ddp")
    if args.save_every is not None and args.save_every < 1:
        raise UsageError(f"--save-every {args.save_every} must be at least 1 (epochs between snapshots). "
                         "HINT: use --save-every 1, or leave it out for no snapshots.")
    snapshot_dir = args.snapshot_dir
    if snapshot_dir is None and (args.save_every or args.save_every_steps):
        snapshot_dir = f"ringtrain-snapshots/{args.workload}"
    save_every = args.save_every if args.save_every is not None else (1 if snapshot_dir else None)
    if args.max_restarts and not args.resume:
        raise UsageError("--no-resume with --max-restarts: every restart would start training afresh and "
                         "lose what earlier attempts learned. HINT: give a new, empty --snapshot-dir "
                         "instead of --no-resume to start afresh.")
    try:
        config = TrainerConfig(
            epochs=args.epochs if args.epochs is not None else defaults.epochs,
            batch_size=args.batch_size if args.batch_size is not None else defaults.batch_size,
            strategy=strategy, fp16_allreduce=args.fp16_allreduce, compression=args.compression,
            sync_every=args.sync_every, outer_lr=args.outer_lr, outer_momentum=args.outer_momentum,
            shard_optimizer=args.shard_optimizer,
            batches_per_allreduce=args.batches_per_allreduce, amp=args.amp, scale_lr=args.scale_lr,
            warmup_epochs=args.warmup_epochs, seed=args.seed, save_every=save_every,
            save_every_steps=args.save_every_steps, snapshot_dir=snapshot_dir, keep_last=args.keep_last,
            snapshot_mode="sync" if args.sync_snapshots else "background",
            resume=args.resume, eval_every=args.eval_every, threads=args.threads,
            num_workers=args.num_workers, progress=args.progress, log_dir=args.log_dir, device=args.device,
            max_steps_per_epoch=args.max_steps_per_epoch, elastic=True if elastic else None,
            signals_to_handle=args.signals_to_handle)
        nproc = 1 if args.np is None else args.np
        job = TrainJob(workload=args.workload, trainer=config, nproc=nproc, data_dir=args.data_dir,
                       download=args.download, cache_dir=args.cache_dir, subset=args.subset, like=args.like,
                       arch=args.arch, optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
                       weight_decay=args.weight_decay, results_json=args.results_json,
                       max_restarts=args.max_restarts, hang_timeout=args.hang_timeout,
                       watch=not args.no_watch, min_np=args.min_np, max_np=args.max_np,
                       host_discovery_script=args.host_discovery_script, node_launch=nodes, ray=ray)
        check_before_training(job, oversubscribe=bool(args.oversubscribe))
        return launch_job(job)
    except RankInputError as exc:
        if not exc.reported:
            raise UsageError(str(exc)) from None
        # the root-cause report above shows the message and its HINT: told once, pointed at here
        raise UsageError("the ranks stopped on an error they reported: see the root-cause report above "
                         "(its 'error' line names the value and the fix).") from None
    except input_errors() as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        # TrainerConfig / TrainJob validation (raised before any rank starts)
        if "HINT:" in str(exc):
            raise UsageError(as_flags(str(exc), args.train_flags)) from None
        raise
