"""The job store's address as text (``host:port``) and where a worker finds it.

Apart from :mod:`ringtrain.engine.job_store` (whose client is a ``torch.distributed.Store``, so importing
it imports torch) for the processes that only hand the address on and need no torch: a Spark task
that sets its rank's variables before it starts the rank (:mod:`ringtrain.spark.task`), a rank's entry
before the user's command has imported anything. ``job_store`` exports the same names.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.engine.auth import ENV_ADDRESS


def address_from_environ(environ: Mapping[str, str]) -> str | None:
    """``RINGTRAIN_JOB_STORE`` in ``environ`` (set by ``ringtrain run`` for its workers), or None."""
    value = environ.get(ENV_ADDRESS, "").strip()
    return value or None


def join_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` from ``host:port`` or ``[v6]:port``; ValueError naming the address otherwise."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"job store address {address!r} is not HOST:PORT. HINT: {ENV_ADDRESS} is set by "
                         "`ringtrain run`; unset it, or give a value like 127.0.0.1:29400.")
    return host.strip("[]"), int(port)


__all__ = ["address_from_environ", "join_address", "split_address"]
