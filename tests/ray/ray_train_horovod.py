"""A Horovod training function under Ray Train's own ``HorovodTrainer``: nothing here knows about ringtrain.

Run with the shim and Train V1 (``RAY_TRAIN_V2_ENABLED=0 python -m ringtrain.shim
tests/ray/ray_train_horovod.py STORAGE_DIR``); ``ray.init()`` joins ``RAY_ADDRESS`` when set (else a
local cluster of three logical CPUs: Train V1's trainer actor takes one). With ``V2=1`` the same
function runs under ``ringtrain.ray.train.HorovodTrainer`` on Train V2 instead.

One run of two workers: a few steps, a checkpoint, then rank 1 fails after its first report;
``FailureConfig(max_failures=1)`` restarts the job from that checkpoint, which trains a few steps more
(``FAIL=0``: no failure, one attempt). Prints one JSON line with what the driver saw.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import ray
import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig

if os.environ.get("V2") == "1":
    from ringtrain.ray.train import HorovodTrainer
else:
    from ray.train.horovod import HorovodTrainer

STEPS = 3


def train_loop(config):
    import horovod.torch as hvd

    hvd.init()
    context = ray.train.get_context()
    torch.manual_seed(1000 + hvd.rank())  # a different model on each rank until the broadcast
    model = torch.nn.Linear(4, 1)
    start, checkpoint = 0, ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        start = state["step"]
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                         named_parameters=model.named_parameters())
    torch.manual_seed(hvd.rank())  # each rank its own data
    for _ in range(STEPS):
        x = torch.randn(16, 4)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    mine = torch.tensor([[hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                          context.get_world_rank(), context.get_world_size(), context.get_local_rank()]])
    everyone = hvd.allgather(mine).tolist()
    all_params = hvd.allgather(params.unsqueeze(0))
    metrics = {"places": everyone, "loss": loss.item(), "step": start + STEPS,
               "resumed": checkpoint is not None,
               "params_equal": bool(torch.equal(all_params[0], all_params[1])), "params": params.tolist()}
    with tempfile.TemporaryDirectory() as folder:
        saved = None
        if hvd.rank() == 0:
            torch.save({"model": model.state_dict(), "step": start + STEPS}, os.path.join(folder, "state.pt"))
            saved = Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=saved)
    if checkpoint is None and hvd.rank() == 1 and config["fail"]:
        raise RuntimeError("planned failure of rank 1 after its first report")


def main():
    storage = os.path.abspath(sys.argv[1])
    # Train V1 gives its trainer actor a CPU of its own besides the workers'
    ray.init() if os.environ.get("RAY_ADDRESS") else ray.init(num_cpus=3)
    trainer = HorovodTrainer(
        train_loop_per_worker=train_loop, train_loop_config={"fail": os.environ.get("FAIL", "1") == "1"},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="restarted", storage_path=storage,
                             failure_config=FailureConfig(max_failures=1)))
    result = trainer.fit()
    # Train V1 keeps the failed attempt's error in the trial's folder
    errors = [str(path) for path in Path(storage).rglob("error.txt")]
    seen = {"metrics": {k: v for k, v in result.metrics.items() if k in ("places", "loss", "step", "resumed",
                                                                          "params_equal")},
            "error": None if result.error is None else str(result.error),
            "checkpoint": result.checkpoint is not None,
            "first_failure": Path(errors[0]).read_text() if errors else None}
    print("RESULT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
