"""The variables a rank reads when a driver that hosts the job store places it (Ray actors, Spark tasks).

torch's env:// names (what ``ringtrain run`` gives its ranks) plus Horovod's, so that both
``init_process_group`` and ``hvd.init()`` find their place and the job store. The job's secret is not
among them: it travels apart, never in a variable a driver might print.
"""

from __future__ import annotations

from ringtrain.engine import auth
from ringtrain.engine.store_address import split_address


def rank_variables(*, rank: int, size: int, local_rank: int, local_size: int, node_rank: int,
                   cross_rank: int, cross_size: int, hostname: str, store_address: str,
                   gloo_timeout_s: float) -> dict[str, str]:
    """The names of one rank's place and of the job store. ``GROUP_WORLD_SIZE`` is left out on purpose:
    without it the cross size is read from ``CROSS_SIZE``, which is per local rank (a host with fewer
    ranks is in fewer cross groups)."""
    return {**place_variables(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                              node_rank=node_rank, cross_rank=cross_rank, cross_size=cross_size,
                              hostname=hostname),
            **store_variables(store_address=store_address, gloo_timeout_s=gloo_timeout_s)}


def place_variables(*, rank: int, size: int, local_rank: int, local_size: int, node_rank: int,
                    cross_rank: int, cross_size: int, hostname: str) -> dict[str, str]:
    """One rank's place alone, for drivers that learn the job store's address only later (Ray Train's
    Horovod backend asks for the places before the rendezvous)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(node_rank),
        "CROSS_RANK": str(cross_rank),
        "CROSS_SIZE": str(cross_size),
        **horovod_variables(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                            cross_rank=cross_rank, cross_size=cross_size, hostname=hostname),
    }


def store_variables(*, store_address: str, gloo_timeout_s: float) -> dict[str, str]:
    """The job store's address, the same for every rank (the secret travels apart)."""
    host, port = split_address(store_address)
    return {
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        auth.ENV_ADDRESS: store_address,
        "HOROVOD_GLOO_TIMEOUT_SECONDS": _seconds(gloo_timeout_s),
    }


def horovod_variables(*, rank: int, size: int, local_rank: int, local_size: int, cross_rank: int,
                      cross_size: int, hostname: str) -> dict[str, str]:
    """Horovod's names of a rank's place (what ``horovodrun``'s gloo mode gives its ranks), on gloo."""
    return {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(cross_rank),
        "HOROVOD_CROSS_SIZE": str(cross_size),
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "PYTHONUNBUFFERED": "1",
    }

def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


__all__ = ["horovod_variables", "place_variables", "rank_variables", "store_variables"]
