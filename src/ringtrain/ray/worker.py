"""The worker actor: one rank of the job, living as long as the executor.

A plain class; the executor turns it into a Ray actor (``ray.remote(RayWorker).options(...)``), so
that the placement (CPUs, GPUs, placement group bundle) is chosen per executor. The actor is created
with no arguments at all: its rank, environment and the job's secret arrive later through
:meth:`RayWorker.join_job`, the secret as a Ray object reference that only the actor reads.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringtrain.engine import auth
from ringtrain.ray.ranks import WorkerNode


class RayWorker:
    """One rank: reports where it runs, takes the job's environment, holds the user's executable."""

    executable: Any = None

    def where(self) -> WorkerNode:
        """The Ray node (id, IP, host name) this actor runs on."""
        import ray  # the ray extra; imported where used, so the package loads without it

        return WorkerNode(node_id=ray.get_runtime_context().get_node_id(),
                          node_ip=ray.util.get_node_ip_address(), hostname=socket.gethostname())

    def gpu_ids(self) -> list[str]:
        """The GPUs Ray gave this actor (as CUDA_VISIBLE_DEVICES names them)."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def join_job(self, environ: Mapping[str, str], secret: Sequence[Any],
                 horovod_dir: str | None = None) -> int:
        """Take this rank's variables and the job's secret (``secret``: a one-element list, so that Ray
        hands the reference over unresolved and the secret never sits in the call's arguments).

        ``horovod_dir``: the folder the driver imported ``horovod`` from (ringtrain's shim, say). The
        user's functions name ``horovod.torch`` by reference, so where this process cannot import
        ``horovod`` itself, that folder goes on its path (and on PYTHONPATH for what it starts).
        """
        import ray

        os.environ.update({str(k): str(v) for k, v in environ.items()})
        if horovod_dir and importlib.util.find_spec("horovod") is None:
            sys.path.insert(0, horovod_dir)
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (horovod_dir, os.environ.get("PYTHONPATH"))
                                                       if p)
        value = ray.get(secret[0]) if secret else None
        if value:
            os.environ[auth.ENV_SECRET] = value
        else:
            os.environ.pop(auth.ENV_SECRET, None)
        return os.getpid()

    def update_env_vars(self, environ: Mapping[str, str]) -> None:
        """Set more variables in this actor (Horovod's worker had the same method)."""
        os.environ.update({str(k): str(v) for k, v in environ.items()})

    def env_vars(self) -> dict[str, str]:
        """This actor's environment, the job's secret left out."""
        return {k: v for k, v in os.environ.items() if k != auth.ENV_SECRET}

    def start_executable(self, executable_cls: type | None = None,
                         executable_args: Sequence[Any] | None = None,
                         executable_kwargs: Mapping[str, Any] | None = None) -> None:
        """Build the user's executable here (None: :meth:`execute` passes None to its functions)."""
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **dict(executable_kwargs or {}))

    def set_queue(self, queue: Any) -> None:
        """Where :func:`ringtrain.ray.ray_logger.log` sends values in this rank (None: nowhere)."""
        from ringtrain.ray import ray_logger

        ray_logger.configure(queue)

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` in this rank."""
        return fn(self.executable)
