"""``ringtrain.run(func)``: Horovod's ``horovod.run`` on top of ``ringtrain run``.

The function and its arguments are cloudpickled into a temporary folder, every rank runs them through
:mod:`ringtrain.launch.func_runner`, and the per-rank results come back in rank order. Remote hosts
must see the same folder (a shared file system), as they see the same working directory.
"""

from __future__ import annotations

import io
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import redirect_stderr
from typing import Any

import cloudpickle

from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.hosts import parse_hostfile, parse_hosts
from ringtrain.launch.temp_folders import make_temp_folder


def run(func: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        num_proc: int | None = None, min_num_proc: int | None = None, max_num_proc: int | None = None,
        slots: int | None = None, reset_limit: int | None = None, cooldown_range: Any = None,
        hosts: str | None = None, hostfile: str | None = None, host_discovery_script: str | None = None,
        start_timeout: float | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        disable_cache: bool | None = None, output_filename: str | None = None, verbose: bool | None = None,
        use_gloo: bool | None = None, use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interface: str | None = None, network_interfaces: str | Sequence[str] | None = None,
        executable: str | None = None, np: int | None = None, min_np: int | None = None,
        max_np: int | None = None) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks; returns their results in rank order.

    Raises ``RuntimeError`` with the root-cause report when a rank fails, ``ValueError`` for bad
    arguments (a :class:`~ringtrain.exceptions.UsageError` where the launcher refuses them). ``np`` is
    the deprecated spelling of ``num_proc``; the elastic arguments (``min_num_proc``,
    ``max_num_proc``, ``host_discovery_script``, ...) are not supported yet.
    """
    num_proc = num_proc if num_proc is not None else np
    elastic = {"min_num_proc": min_num_proc if min_num_proc is not None else min_np,
               "max_num_proc": max_num_proc if max_num_proc is not None else max_np,
               "host_discovery_script": host_discovery_script, "reset_limit": reset_limit,
               "cooldown_range": cooldown_range, "slots": slots}
    given = [name for name, value in elastic.items() if value is not None]
    if given:
        raise ValueError(f"ringtrain.run does not support elastic arguments yet ({', '.join(given)}). "
                         "HINT: give num_proc and hosts for a fixed-size job.")
    if executable is not None and executable != sys.executable:
        raise ValueError(f"executable={executable!r}: ringtrain.run starts ranks with this interpreter "
                         f"({sys.executable}). HINT: call ringtrain.run from the Python you want the "
                         "ranks in.")
    if isinstance(network_interfaces, str):
        nics: tuple[str, ...] = tuple(n for n in network_interfaces.split(",") if n)
    else:
        nics = tuple(network_interfaces or ())
    if network_interface:
        nics = (*nics, *[n for n in network_interface.split(",") if n])
    host_list = parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile else None
    if num_proc is None:
        num_proc = sum(h.slots for h in host_list) if host_list else 1
    if num_proc < 1:
        raise ValueError(f"num_proc={num_proc} must be at least 1. HINT: pass num_proc=2 or more.")
    from ringtrain.launch.entry import launch

    folder = make_temp_folder("ringtrain-func-")  # a SIGKILL'd launcher's is removed at the next start
    try:
        with open(folder / "call.pkl", "wb") as fp:
            cloudpickle.dump((func, tuple(args), dict(kwargs or {})), fp)
        config = LaunchConfig(
            command=(sys.executable, "-m", "ringtrain.launch.func_runner", str(folder)),
            num_proc=num_proc, hosts=host_list, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
            start_timeout=float(start_timeout or 30), network_interfaces=nics,
            output_filename=output_filename, verbose=bool(verbose),
        )
        report = io.StringIO()
        with redirect_stderr(_Tee(report, sys.stderr)):
            code = launch(config)
        if code != 0:
            text = report.getvalue()
            start = text.find("ringtrain run: job failed")
            raise RuntimeError(text[start:] if start >= 0 else f"ranks failed (exit code {code})")
        results = []
        for rank in range(num_proc):
            with open(folder / f"result.{rank}.pkl", "rb") as fp:
                results.append(cloudpickle.load(fp))
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _Tee(io.TextIOBase):
    """Write to two streams: the caller still sees rank output, and we keep the report."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()
