"""Freeze the public surface: the names of ``horovod.torch`` (section 1.1 of the API contract) exported
by ``ringtrain`` and by the shim's ``horovod.torch``, and the positional signatures scripts rely on."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import ringtrain
from ringtrain.shim import SHIM_DIR

SECTION_1_1 = {
    "init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank", "local_rank",
    "cross_rank",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "nccl_built",
    "ddl_built", "ccl_built", "cuda_built", "rocm_built",
    "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_async", "allreduce_", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_allreduce_", "grouped_allreduce_async_", "sparse_allreduce_async",
    "allgather", "allgather_async", "grouped_allgather", "grouped_allgather_async",
    "broadcast", "broadcast_async", "broadcast_", "broadcast_async_",
    "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async",
    "join", "barrier", "poll", "synchronize",
    "start_timeline", "stop_timeline",
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "DistributedOptimizer", "Compression", "SyncBatchNorm", "elastic",
    "HorovodInternalError",
}
SUPERSET = {"is_homogeneous"}

PS = "process_set"
SCALES = ["prescale_factor", "postscale_factor"]
# name -> parameter names in positional order (Horovod 0.28.1)
SIGNATURES = {
    "init": ["comm", "process_sets"],
    "allreduce": ["tensor", "average", "name", "compression", "op", *SCALES, PS],
    "allreduce_async": ["tensor", "average", "name", "op", *SCALES, PS],
    "allreduce_": ["tensor", "average", "name", "op", *SCALES, PS],
    "allreduce_async_": ["tensor", "average", "name", "op", *SCALES, PS],
    "grouped_allreduce": ["tensors", "average", "name", "compression", "op", "prescale_factor",
                          "postscale_factor", PS],
    "grouped_allreduce_async": ["tensors", "average", "name", "op", *SCALES, PS],
    "grouped_allreduce_": ["tensors", "average", "name", "op", *SCALES, PS],
    "grouped_allreduce_async_": ["tensors", "average", "name", "op", *SCALES, PS],
    "sparse_allreduce_async": ["tensor", "name", "op", PS],
    "allgather": ["tensor", "name", PS],
    "allgather_async": ["tensor", "name", PS],
    "grouped_allgather": ["tensors", "name", PS],
    "broadcast": ["tensor", "root_rank", "name", PS],
    "broadcast_async": ["tensor", "root_rank", "name", PS],
    "broadcast_": ["tensor", "root_rank", "name", PS],
    "broadcast_async_": ["tensor", "root_rank", "name", PS],
    "alltoall": ["tensor", "splits", "name", PS],
    "alltoall_async": ["tensor", "splits", "name", PS],
    "reducescatter": ["tensor", "name", "compression", "op", PS, "prescale_factor", "postscale_factor"],
    "reducescatter_async": ["tensor", "name", "op", PS, "prescale_factor", "postscale_factor"],
    "grouped_reducescatter": ["tensors", "name", "compression", "op", PS, "prescale_factor",
                              "postscale_factor"],
    "join": ["device"],
    "barrier": [PS],
    "poll": ["handle"],
    "synchronize": ["handle"],
    "start_timeline": ["file_path", "mark_cycles"],
    "broadcast_parameters": ["params", "root_rank"],
    "broadcast_optimizer_state": ["optimizer", "root_rank", "model"],
    "broadcast_object": ["obj", "root_rank", "name", PS],
    "allgather_object": ["obj", "name"],
    "DistributedOptimizer": ["optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
                             "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense", PS],
}

DEFAULTS = {
    "DistributedOptimizer": {"named_parameters": None, "backward_passes_per_step": 1,
                             "gradient_predivide_factor": 1.0, "num_groups": 0, "groups": None,
                             "sparse_as_dense": False},
    "broadcast_object": {"root_rank": 0, "name": None},
    "join": {"device": -1},
    "start_timeline": {"mark_cycles": False},
    "allreduce": {"average": None, "name": None, "op": None, "prescale_factor": 1.0, "postscale_factor": 1.0},
}


def test_ringtrain_exports_exactly_the_horovod_names():
    beyond = {"run", "Trainer", "TrainerConfig", "stop_requested", "PREEMPTED_EXIT", "LocalSGD",
              "save_snapshot", "load_snapshot"}
    assert set(ringtrain.__all__) == SECTION_1_1 | SUPERSET | beyond
    for name in ringtrain.__all__:
        assert getattr(ringtrain, name) is not None, name


def test_reduce_op_values():
    assert [ringtrain.Average, ringtrain.Sum, ringtrain.Adasum, ringtrain.Min, ringtrain.Max,
            ringtrain.Product] == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_positional_signatures(name):
    params = list(inspect.signature(getattr(ringtrain, name)).parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional[:len(SIGNATURES[name])] == SIGNATURES[name]
    for param, default in DEFAULTS.get(name, {}).items():
        assert inspect.signature(getattr(ringtrain, name)).parameters[param].default == default


def test_process_set_default_is_the_global_set():
    for name, params in SIGNATURES.items():
        if PS in params:
            assert inspect.signature(getattr(ringtrain, name)).parameters[PS].default is \
                ringtrain.global_process_set, name


def test_elastic_and_other_importable_names():
    assert {"run", "State", "ObjectState", "TorchState", "ElasticSampler"} <= set(dir(ringtrain.elastic))
    params = list(inspect.signature(ringtrain.elastic.ElasticSampler).parameters)
    assert params == ["dataset", "shuffle", "seed"]
    assert list(inspect.signature(ringtrain.SyncBatchNorm).parameters)[:5] == [
        "num_features", "eps", "momentum", "affine", "track_running_stats"]


SHIM_CHECK = r"""
import inspect, json
import horovod, horovod.torch as hvd, ringtrain
from horovod.torch.optimizer import _DistributedOptimizer
from horovod.torch.compression import Compressor, NoneCompressor, FP16Compressor
from horovod.torch.mpi_ops import synchronize
from horovod.torch.elastic import sampler, state
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.elastic import ObjectState, State
from horovod.common.process_sets import ProcessSet
from horovod.runner.util.threads import in_thread
from horovod.runner import run
public = sorted(n for n in dir(hvd) if not n.startswith("_") and n not in ("annotations",))
print(json.dumps({
    "file": horovod.__file__, "version": horovod.__version__, "public": public,
    "same": all(getattr(hvd, n) is getattr(ringtrain, n) for n in hvd.__all__ if n != "elastic"),
    "mpi_ops": hvd.mpi_ops is ringtrain.mpi_ops and synchronize is ringtrain.synchronize,
    "sampler": sampler.ElasticSampler is ringtrain.elastic.ElasticSampler,
    "state": state.TorchState is ringtrain.elastic.TorchState
             and ObjectState is ringtrain.elastic.ObjectState,
    "errors": HorovodInternalError is ringtrain.HorovodInternalError,
    "torch_elastic_run": hvd.elastic.run is ringtrain.elastic.run,
}))
"""


def test_shim_exports_the_same_objects():
    import json
    import os

    env = dict(os.environ, PYTHONPATH=str(SHIM_DIR))
    out = subprocess.run([sys.executable, "-c", SHIM_CHECK], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    result = json.loads(out.stdout)
    assert result["file"].startswith(str(SHIM_DIR))
    assert result["version"] == "0.28.1"
    # submodules imported above show up as attributes, as they do in real Horovod
    submodules = {"mpi_ops", "optimizer", "compression", "functions", "sync_batch_norm"}
    assert set(result["public"]) - submodules == SECTION_1_1 | SUPERSET
    assert result["same"]
    assert result["mpi_ops"]
    assert result["sampler"]
    assert result["state"]
    assert result["errors"]
    assert result["torch_elastic_run"]
