"""torchrun's node and rendezvous flags, shared by ``ringtrain run`` and ``ringtrain train``.

Both read their defaults from torchrun's ``PET_<FLAG>`` variables (as torchrun does; Kubeflow's
operators configure a pod's launcher that way) and from ``RINGTRAIN_<FLAG>``, which wins; a flag given
on the command line wins over both. An error names the flag, or the variable the bad value came from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ringtrain.cli.options import EnvFlag, EnvOption, non_negative, spellings, value_source
from ringtrain.exceptions import UsageError

#: The node flags a rank must not act on again: it was started by a launcher that used them already.
NODE_DESTS = ("nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
              "standalone", "master_addr", "master_port", "local_addr", "rdzv_conf")


def add_node_arguments(group: Any, environ: Mapping[str, str]) -> None:
    """Add torchrun's node and rendezvous flags to ``group`` (a parser or an argument group).

    ``--max-restarts`` is not among them: each command words its own (``ringtrain train``'s resumes
    from a snapshot), though both read ``PET_MAX_RESTARTS``.
    """
    nonneg_int = non_negative(int)

    def option(*names: str, **kwargs: Any) -> None:
        group.add_argument(*spellings(*names), action=EnvOption, environ=environ, torchrun=True, **kwargs)

    option("--nnodes", dest="nnodes", metavar="N|MIN:MAX", help="number of nodes")
    option("--nproc-per-node", dest="nproc_per_node", metavar="N|cpu|gpu|auto", help="processes on this node")
    option("--node-rank", dest="node_rank", type=nonneg_int, help="index of this node")
    option("--rdzv-backend", dest="rdzv_backend", help="rendezvous backend: static (default) or c10d")
    option("--rdzv-endpoint", dest="rdzv_endpoint", metavar="HOST:PORT", help="rendezvous address")
    option("--rdzv-id", dest="rdzv_id", help="job id shared by all nodes")
    group.add_argument(*spellings("--standalone"), dest="standalone", action=EnvFlag, environ=environ,
                       torchrun=True, help="single node, rendezvous on a free local port")
    option("--master-addr", dest="master_addr", help="address of node 0 (static rendezvous)")
    option("--master-port", dest="master_port", type=nonneg_int,
           help="port of the rendezvous store on node 0")
    option("--local-addr", dest="local_addr", metavar="ADDRESS",
           help="this node's address for the rendezvous (c10d: node 0's becomes the workers' MASTER_ADDR)")
    option("--rdzv-conf", dest="rdzv_conf", metavar="KEY=VALUE,...",
           help="extra rendezvous settings, e.g. timeout=120")


def node_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The checked :class:`~ringtrain.launch.config.LaunchConfig` fields of the node flags in ``args``."""
    for error in getattr(args, "env_errors", ()):  # a PET_* switch that is not a boolean
        raise UsageError(error)
    if args.master_port is not None and args.master_port > 65535:
        raise UsageError(f"{value_label(args, 'master_port')}{args.master_port} is not a TCP port. "
                         "HINT: use 1024..65535.")
    if args.rdzv_backend and args.rdzv_backend not in ("static", "c10d"):
        raise UsageError(f"{value_label(args, 'rdzv_backend')}{args.rdzv_backend!r} is not supported. "
                         "HINT: use c10d (elastic) or static.")
    nnodes = parse_nnodes(args.nnodes, value_label(args, "nnodes")) if args.nnodes else None
    if nnodes and args.node_rank is not None and args.node_rank >= nnodes[1]:
        raise UsageError(f"{value_label(args, 'node_rank')}{args.node_rank} is not below "
                         f"{value_label(args, 'nnodes')}{nnodes[1]}. HINT: node ranks run from 0 to "
                         f"{nnodes[1] - 1}; unset stale values.")
    per_node = args.nproc_per_node and parse_nproc_per_node(args.nproc_per_node,
                                                            value_label(args, "nproc_per_node"))
    return {
        "nnodes": nnodes,
        "nproc_per_node": per_node or None,
        "node_rank": args.node_rank,
        "rdzv_backend": args.rdzv_backend,
        "rdzv_endpoint": args.rdzv_endpoint,
        "rdzv_id": args.rdzv_id,
        "standalone": bool(args.standalone),
        "master_addr": args.master_addr,
        "master_port": args.master_port,
        "local_addr": args.local_addr,
        "rdzv_conf": parse_rdzv_conf(args.rdzv_conf, value_label(args, "rdzv_conf")),
    }


def flag_or_variable(args: argparse.Namespace, dest: str) -> str:
    """How an error names a value: ``--flag`` given on the command line, or ``VARIABLE=`` it came from."""
    source = value_source(args, dest)
    return "--" + dest.replace("_", "-") if source in ("command line", "default") else f"{source}="


#: The torchrun flags whose values --verbose lists with their sources.
_SOURCE_SHOWN = ("nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
                 "master_addr", "master_port", "max_restarts", "standalone")


def describe_sources(args: argparse.Namespace) -> list[str]:
    """``name=value (from SOURCE)`` for each torchrun flag that is set (for --verbose)."""
    values = {dest: getattr(args, dest, None) for dest in _SOURCE_SHOWN}
    # by identity: node rank 0 and --max-restarts 0 are values to tell (0 == False)
    return [f"--{dest.replace('_', '-')} {value} (from {value_source(args, dest)})"
            for dest, value in values.items() if value is not None and value is not False]


def parse_nnodes(value: str, label: str = "--nnodes ") -> tuple[int, int]:
    """``N`` or ``MIN:MAX``, both at least 1; ``label`` names the flag or variable in the error."""
    parts = value.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers) < 1 or numbers[0] > numbers[-1]:
        raise UsageError(f"{label}{value!r} is not N or MIN:MAX with 1 <= MIN <= MAX. "
                         f"HINT: write e.g. {label}2 or {label}1:4.")
    return numbers[0], numbers[-1]


def parse_nproc_per_node(value: str, label: str = "--nproc-per-node ") -> int:
    """A count, or ``cpu`` / ``gpu`` / ``auto`` as torchrun understands them; ``label`` as in parse_nnodes."""
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value == "cpu":
        return os.cpu_count() or 1
    if value in ("gpu", "auto"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count:
            return count
        if value == "auto":
            return os.cpu_count() or 1
        raise UsageError(f"{label}{value!r} asks for GPUs but no CUDA device is visible. "
                         "HINT: use a number or 'cpu', or run on a machine with GPUs.")
    raise UsageError(f"{label}{value!r} is not a positive number, 'cpu', 'gpu' or 'auto'. "
                     "HINT: write e.g. --nproc-per-node 4.")


#: Rendezvous settings that torch reads as whole numbers (seconds, or a count for keep_alive_max_attempt).
_RDZV_WHOLE_SECONDS = frozenset({"timeout", "read_timeout", "join_timeout", "last_call_timeout",
                                 "close_timeout", "heartbeat", "keep_alive_interval",
                                 "keep_alive_max_attempt"})


def parse_rdzv_conf(value: str | None, label: str = "--rdzv-conf ") -> dict[str, str]:
    """``key=value,key=value`` (torchrun's --rdzv-conf); node ranks come from --node-rank, not from here."""
    conf: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"{label}{value!r}: {item!r} is not KEY=VALUE. "
                             "HINT: write e.g. --rdzv-conf timeout=120,read_timeout=60.")
        if key == "rank":
            raise UsageError(f"{label}{value!r} sets the node rank. HINT: give it as --node-rank "
                             f"{val.strip() or 'N'} instead.")
        if key in _RDZV_WHOLE_SECONDS and not val.strip().isdigit():
            raise UsageError(f"{label}{value!r}: {key}={val.strip()!r} is not a whole number of "
                             f"{'attempts' if key.endswith('attempt') else 'seconds'}. HINT: e.g. {key}=60.")
        if key == "is_host" and val.strip().lower() not in ("0", "1", "true", "false", "yes", "no"):
            raise UsageError(f"{label}{value!r}: is_host={val.strip()!r} is not true or false. "
                             "HINT: e.g. is_host=true on the node that hosts the rendezvous store.")
        conf[key] = val.strip()
    return conf


def value_label(args: argparse.Namespace, dest: str) -> str:
    """How an error names a value before it: ``--flag `` or ``VARIABLE=``."""
    name = flag_or_variable(args, dest)
    return name if name.endswith("=") else name + " "
