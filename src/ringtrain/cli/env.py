"""``ringtrain env``: which launcher or scheduler this process is in, and what it makes of it.

Wrong detection is the first cause of hangs, so this prints every choice: the environment, the
variables it read, the resulting placement and the consistency warnings. Exit code 0 when a
placement could be computed (warnings or not), 1 when it could not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

#: Placement fields in print order, with their labels.
_LABELS = (("rank", "rank"), ("world_size", "world size"), ("local_rank", "local rank"),
           ("local_world_size", "local world size"), ("node_rank", "node rank"), ("num_nodes", "nodes"),
           ("cross_rank", "cross rank"), ("cross_size", "cross size"), ("main_address", "main address"),
           ("main_port", "main port"), ("hostname", "hostname"))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``env`` subcommand."""
    parser = subparsers.add_parser(
        "env", help="show the detected launcher/scheduler and the rank, sizes and address it gives",
        description="Show which launcher or scheduler started this process (torchrun, horovodrun, Slurm, "
                    "PBS, LSF, Open MPI, MPICH/Intel MPI, PMIx, MVAPICH, Cray PALS, a Kubernetes pod of "
                    "Kubeflow Trainer v2, a PyTorchJob, a JobSet or an MPIJob launcher, or none), the "
                    "variables it came from, the resulting placement and any inconsistencies. Run it "
                    "the way you run training, e.g. `srun ringtrain env` or `mpirun -np 2 ringtrain env`.")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def launcher_values(environ: dict[str, str]) -> list[str]:
    """What ``ringtrain run`` would take from this environment's variables (torchrun's ``PET_*`` and
    ``RINGTRAIN_*``), each with its source; a bad value becomes a line saying so."""
    from ringtrain.cli.run import add_run_arguments, describe_sources

    parser = _RaisingParser(prog="ringtrain run", add_help=False)
    try:
        add_run_arguments(parser, environ)
        args = parser.parse_args(["true"])
    except argparse.ArgumentError as exc:
        return [f"cannot start: {exc}"]
    lines = [f"cannot start: {error}" for error in getattr(args, "env_errors", ())]
    return lines + [line for line in describe_sources(args) if "(from default)" not in line]


class _RaisingParser(argparse.ArgumentParser):
    """A parser that raises its error instead of printing it and exiting: ``ringtrain env`` reports it."""

    def error(self, message: str) -> Any:
        raise argparse.ArgumentError(None, message)


def report(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything ``ringtrain env`` shows, as plain data."""
    # here, not at the top: every command builds this module's parser, and the detectors cost time
    from ringtrain.env import ENVIRONMENTS, ClusterEnvironmentError, detect_environment

    environ = dict(os.environ) if environ is None else environ
    env = detect_environment(environ)
    result: dict[str, Any] = {
        "environment": env.name,
        "class": type(env).__name__,
        "also_matched": [cls.name for cls in ENVIRONMENTS if cls is not type(env) and cls.name != "single"
                         and cls.detect(environ)],
        "variables": env.source_variables(),
        "placement": None,
        "error": None,
        "warnings": list(dict.fromkeys(env.validate())),
        "ringtrain_run": launcher_values(environ),
    }
    try:
        result["placement"] = dataclasses.asdict(env.placement())
    except ClusterEnvironmentError as exc:
        result["error"] = str(exc)
    return result


def format_text(data: dict[str, Any]) -> str:
    """The human-readable form of :func:`report`."""
    lines = [f"environment: {data['environment']} ({data['class']})"]
    if data["also_matched"]:
        lines.append(f"also matched (lower priority): {', '.join(data['also_matched'])}")
    lines.append("variables:" if data["variables"] else "variables: (none)")
    lines += [f"  {key}={value}" for key, value in sorted(data["variables"].items())]
    if data["placement"] is not None:
        lines.append("placement:")
        width = max(len(label) for _, label in _LABELS)
        lines += [f"  {label:<{width}}  {data['placement'][key]}" for key, label in _LABELS]
    else:
        lines.append(f"placement: unavailable: {data['error']}")
    if data.get("ringtrain_run"):
        lines.append("ringtrain run here would use:")
        lines += [f"  {line}" for line in data["ringtrain_run"]]
    shown = [w for w in data["warnings"] if w != data["error"]]
    if shown:
        lines.append("warnings:")
        lines += [f"  - {warning}" for warning in shown]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when no placement can be computed."""
    data = report()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(format_text(data))
    sys.stdout.flush()
    return 0 if data["placement"] is not None else 1
