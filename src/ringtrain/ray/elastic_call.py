"""Worker side of an elastic Ray executor job: fetch the call, run it, hand this rank's result back.

``python -m ringtrain.ray.elastic_call ADDRESS`` is the command each elastic worker of
:class:`~ringtrain.ray.elastic.ElasticJob` runs (under ``ringtrain run --ray --min-np``): it reads the
cloudpickled ``(fn, args, kwargs)`` from the executor's job store at ``ADDRESS`` (authenticated with
the job's secret, which the elastic driver handed this worker on its stdin), calls it, and stores
the result under the rank this worker holds when ``fn`` returns: the job succeeds only once every
worker of the last generation returned, so ranks ``0 .. size-1`` of that generation are the result.
"""

from __future__ import annotations

import os
import sys

import cloudpickle

from ringtrain.engine import job_store
from ringtrain.ray import ray_logger
from ringtrain.ray.elastic import CALL_KEY, SIZE_KEY, result_key


def final_place() -> tuple[int, int]:
    """This worker's rank and the world size now: the engine's when ``fn`` initialized it, else the
    variables of the generation the worker was started in."""
    from ringtrain.ops.basics import is_initialized, rank, size

    if is_initialized():
        return rank(), size()
    return int(os.environ.get("HOROVOD_RANK", "0")), int(os.environ.get("HOROVOD_SIZE", "1"))


def main(address: str) -> int:
    store = job_store.JobStore(address, job_store.secret_from_environ(os.environ), timeout=60.0)
    try:
        fn, args, kwargs = cloudpickle.loads(store.get(CALL_KEY))
        ray_logger.configure(ray_logger.StoreSink(store))  # fn's ray_logger.log() values, for the callbacks
        result = fn(*args, **kwargs)
        rank, size = final_place()
        store.set(result_key(rank), cloudpickle.dumps(result))
        store.set(SIZE_KEY, str(size))
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m ringtrain.ray.elastic_call STORE_ADDRESS", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
