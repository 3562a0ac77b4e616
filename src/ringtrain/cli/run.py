"""``ringtrain run``: horovodrun's and torchrun's flags in one parser.

Every flag can also come from one environment variable, ``RINGTRAIN_<DEST>`` (for example
``RINGTRAIN_NPROC_PER_NODE=4`` or ``RINGTRAIN_NUM_PROC=2``); a flag on the command line wins. Long
flags accept both ``--dash-case`` and ``--snake_case``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ringtrain.launch.config import TUNING_FLAGS, config_from_args

ENV_PREFIX = "RINGTRAIN_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(dest: str) -> str:
    """The environment variable that sets the flag whose argparse ``dest`` is ``dest``."""
    return ENV_PREFIX + dest.upper()


def _parse_bool(name: str, value: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{name}={value!r} is not a boolean. HINT: set it to 1 or 0.")


class EnvOption(argparse.Action):
    """A valued option whose default comes from ``RINGTRAIN_<DEST>`` when that variable is set.

    The value is a string, so argparse still runs it through ``type`` and reports bad values the
    same way as bad flags (exit code 2).
    """

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 default: Any = None, help: str | None = None, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        if env_name(dest) in environ:
            default = environ[env_name(dest)]
        if help and help != argparse.SUPPRESS:
            help = f"{help} [env {env_name(dest)}]"
        super().__init__(option_strings, dest, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class EnvFlag(argparse.Action):
    """A switch (``--flag`` sets ``const``) whose default comes from ``RINGTRAIN_<DEST>=1|0``."""

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 const: Any = True, default: Any = None, help: str | None = None, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        name = env_name(dest)
        if name in environ:
            try:
                flag = _parse_bool(name, environ[name])
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(None, str(exc)) from None
            default = const if flag else (not const if isinstance(const, bool) else None)
        if help and help != argparse.SUPPRESS:
            help = f"{help} [env {name}]"
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)


def _non_negative(kind: type) -> Any:
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"{text} must be >= 0")
        return value

    convert.__name__ = kind.__name__
    return convert


def _spellings(*names: str) -> list[str]:
    """The given option strings plus the snake_case spelling of every dashed long option."""
    out = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            out.append("--" + name[2:].replace("-", "_"))
    return out


def add_run_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Add every ``ringtrain run`` flag to ``parser``; defaults may come from ``environ``."""
    environ = os.environ if environ is None else environ

    def option(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*_spellings(*names), action=EnvOption, environ=environ, **kwargs)

    def flag(*names: str, **kwargs: Any) -> None:
        parser.add_argument(*_spellings(*names), action=EnvFlag, environ=environ, **kwargs)

    nonneg_int, nonneg_float = _non_negative(int), _non_negative(float)
    option("-np", "--num-proc", dest="num_proc", type=int, metavar="N", help="total number of processes")
    option("-H", "--hosts", dest="hosts", metavar="HOST:SLOTS,...", help="hosts and their slots")
    option("-hostfile", "--hostfile", dest="hostfile", metavar="FILE", help="file of 'host slots=N' lines")
    option("-p", "--ssh-port", dest="ssh_port", type=nonneg_int, help="ssh port of the remote hosts")
    option("-i", "--ssh-identity-file", dest="ssh_identity_file", metavar="FILE", help="ssh private key")
    flag("--gloo", dest="gloo", help="use gloo (the default; accepted for horovodrun compatibility)")
    flag("--mpi", dest="mpi", help="changes nothing: ringtrain has no MPI mode, ranks talk over gloo/NCCL "
         "either way (prints a note); to launch with mpirun, run mpirun yourself")
    option("--mpi-args", dest="mpi_args", help="accepted and ignored")
    option("--binding-args", dest="binding_args", help="accepted and ignored")
    flag("--disable-cache", dest="disable_cache", help="accepted (nothing is cached)")
    option("--start-timeout", dest="start_timeout", type=nonneg_float, default="30",
           help="seconds allowed for reaching hosts and starting (default 30)")
    option("--network-interfaces", "--network-interface", dest="network_interfaces", metavar="NIC,...",
           help="network interfaces for gloo/NCCL (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)")
    option("--output-filename", dest="output_filename", metavar="DIR",
           help="also write each rank's output to DIR/rank.<N>/stdout and stderr")
    flag("--verbose", dest="verbose", help="print the resolved configuration and launcher steps")
    flag("-cb", "--check-build", dest="check_build", help="print what this installation supports and exit")
    option("--log-level", dest="log_level", choices=["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"],
           help="HOROVOD_LOG_LEVEL of the workers")
    tuning = parser.add_argument_group("tuning options (set HOROVOD_* variables of the workers)")
    for spec in TUNING_FLAGS:
        names = _spellings(spec.flag)
        if spec.kind == "bool":
            tuning.add_argument(*names, dest=spec.dest, action=EnvFlag, environ=environ, const=True,
                                help=spec.help)
            tuning.add_argument(*_spellings("--no-" + spec.flag[2:]), dest=spec.dest, action=EnvFlag,
                                environ={}, const=False, help=argparse.SUPPRESS)
        elif spec.kind == "true":
            tuning.add_argument(*names, dest=spec.dest, action=EnvFlag, environ=environ, help=spec.help)
        else:
            kind = {"int": nonneg_int, "float": nonneg_float, "str": str}[spec.kind]
            tuning.add_argument(*names, dest=spec.dest, action=EnvOption, environ=environ, type=kind,
                                help=spec.help)

    tr = parser.add_argument_group("torchrun options")
    tr.add_argument(*_spellings("--nnodes"), dest="nnodes", action=EnvOption, environ=environ,
                    metavar="N|MIN:MAX", help="number of nodes")
    tr.add_argument(*_spellings("--nproc-per-node"), dest="nproc_per_node", action=EnvOption, environ=environ,
                    metavar="N|cpu|gpu|auto", help="processes on this node")
    tr.add_argument(*_spellings("--node-rank"), dest="node_rank", action=EnvOption, environ=environ,
                    type=nonneg_int, help="index of this node")
    tr.add_argument(*_spellings("--rdzv-backend"), dest="rdzv_backend", action=EnvOption, environ=environ,
                    help="rendezvous backend: static (default) or c10d")
    tr.add_argument(*_spellings("--rdzv-endpoint"), dest="rdzv_endpoint", action=EnvOption, environ=environ,
                    metavar="HOST:PORT", help="rendezvous address")
    tr.add_argument(*_spellings("--rdzv-id"), dest="rdzv_id", action=EnvOption, environ=environ,
                    help="job id shared by all nodes")
    tr.add_argument(*_spellings("--standalone"), dest="standalone", action=EnvFlag, environ=environ,
                    help="single node, rendezvous on a free local port")
    tr.add_argument(*_spellings("--max-restarts"), dest="max_restarts", action=EnvOption, environ=environ,
                    type=nonneg_int, default="0", help="restarts of the worker group before failing")
    tr.add_argument(*_spellings("--master-addr"), dest="master_addr", action=EnvOption, environ=environ,
                    help="address of node 0 (static rendezvous)")
    tr.add_argument(*_spellings("--master-port"), dest="master_port", action=EnvOption, environ=environ,
                    type=nonneg_int, help="port of the rendezvous store on node 0")
    tr.add_argument(*_spellings("--no-horovod-shim"), dest="no_horovod_shim", action=EnvFlag, environ=environ,
                    help="do not put ringtrain's 'horovod' package on the workers' PYTHONPATH")
    # Internal: set by a multi-host driver for the per-host agents it starts.
    for name in ("--node-slots", "--node-hosts"):
        parser.add_argument(name, dest=name[2:].replace("-", "_"), default=None, help=argparse.SUPPRESS)
    for name in ("--failure-marker", "--watch-stdin"):
        parser.add_argument(name, dest=name[2:].replace("-", "_"), action="store_true",
                            help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                        help="program to run: 'python train.py ...', 'train.py ...' or any executable")


def run_command(args: argparse.Namespace) -> int:
    """Entry of ``ringtrain run``: flags -> ``LaunchConfig`` -> ``launch``."""
    from ringtrain.launch.driver import launch

    return launch(config_from_args(args))


def register(subparsers: Any) -> None:
    """Add the ``run`` subcommand."""
    parser = subparsers.add_parser(
        "run",
        help="start a command on many processes and hosts (horovodrun / torchrun compatible)",
        description="Start COMMAND as -np ranks on this machine, on -H hosts over ssh, or inside a "
                    "Slurm/PBS allocation. Flags can also be set as RINGTRAIN_<FLAG> variables.",
    )
    add_run_arguments(parser)
    parser.set_defaults(func=run_command)
