"""Horovod's three Ray examples, as a Horovod user writes them: nothing here knows about ringtrain.

Run with the shim (``python -m ringtrain.shim tests/ray/horovod_ray_examples.py``); ``ray.init()``
joins the cluster of ``RAY_ADDRESS`` when set. ``HOSTS=2`` places one worker on each of two hosts.
Prints one line per example; any failed check raises.
"""

import os
import socket

import horovod.torch as hvd
import ray
import torch
from horovod.ray import RayExecutor

HOSTS = int(os.environ.get("HOSTS", "0"))


def make_executor(settings):
    if HOSTS:
        return RayExecutor(settings, num_hosts=HOSTS, num_workers_per_host=1, cpus_per_worker=1)
    return RayExecutor(settings, num_workers=2, cpus_per_worker=1)


def whoami():
    hvd.init()
    print("hello from rank", hvd.rank(), "of", hvd.size(), "on", socket.gethostname(), flush=True)
    return hvd.rank(), socket.gethostname()


class Replica:
    """A model replica that lives in its worker between calls."""

    def __init__(self, learning_rate):
        hvd.init()
        torch.manual_seed(1234)
        self.model = torch.nn.Linear(4, 1)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=learning_rate)
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters())
        generator = torch.Generator().manual_seed(hvd.rank())
        self.inputs = torch.randn(16, 4, generator=generator)
        self.targets = self.inputs.sum(dim=1, keepdim=True)

    def train(self):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def get_weights(self):
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}


def train(steps):
    hvd.init()
    torch.manual_seed(hvd.rank())  # different start on every rank: the broadcast must fix that
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    inputs = torch.randn(64, 8)
    targets = inputs[:, :1] * 2 - inputs[:, 1:2]
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    return losses, torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    ray.init()
    settings = RayExecutor.create_settings(timeout_s=120)

    executor = make_executor(settings)
    executor.start()
    places = executor.run(whoami)
    ranks = [rank for rank, _ in places]
    assert len(set(ranks)) == executor.num_workers, ranks
    # from the results: Ray forwards the workers' own lines to this driver when it will, maybe after it ended
    for rank, host in places:
        print(f"rank {rank} of {len(places)} ran on {host}", flush=True)
    executor.shutdown()
    print("stateless run: ranks", ranks, flush=True)

    executor = make_executor(settings)
    executor.start(executable_cls=Replica, executable_args=[0.05])
    losses = [executor.execute(lambda worker: worker.train()) for _ in range(5)]
    weights = executor.execute(lambda worker: worker.get_weights())
    assert all(isinstance(w, dict) for w in weights)
    for name in weights[0]:
        assert all(torch.equal(weights[0][name], w[name]) for w in weights), f"replicas differ in {name}"
    executor.shutdown()
    print("stateful execute: first loss", round(losses[0][0], 4), "last", round(losses[-1][0], 4), flush=True)

    executor = make_executor(settings)
    executor.start()
    results = executor.run(train, args=[30])
    executor.shutdown()
    first, last, params = results[0][0][0], results[0][0][-1], results[0][1]
    assert all(torch.equal(params, r[1]) for r in results), "ranks ended with different weights"
    assert all(r[0] == results[0][0] for r in results), "ranks saw different averaged losses"
    assert last < first / 2, (first, last)
    print("DistributedOptimizer training: loss", round(first, 4), "->", round(last, 4), flush=True)


if __name__ == "__main__":
    main()
