"""A local Ray cluster for the tests of this folder, with a path its workers must import from."""

from __future__ import annotations

import os
from pathlib import Path

import ray


def start_local_ray(num_cpus: int, path_first: Path) -> str:
    """``ray.init`` a local cluster of ``num_cpus`` CPUs and return its GCS address.

    The raylet and its workers inherit this process's environment at ``ray.init``: ``path_first`` is put
    at the front of PYTHONPATH for that moment only (the shim, for Ray Train's own actors that import
    ``horovod``; or the repository, for workers that unpickle a test module's functions by reference).
    """
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(path_first), saved) if p)
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return ray.get_runtime_context().gcs_address
