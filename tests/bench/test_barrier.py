"""The ``barrier`` reference on 2 real ranks: a plain optimizer, and no rank steps ahead of the others."""

import time

from ringtrain.bench.barrier import BarrierStrategy
from ringtrain.bench.hook import parameters_digest
from tests.ranks import RankPool

STEPS = 4
LATE = 0.5  # seconds rank 1 spends after its first step


def _barrier_run() -> tuple[int, int, list[float], str]:
    """On each rank: 4 steps of the MNIST CNN under the barrier strategy; rank 1 is late once."""
    import torch

    from ringtrain.train.config import TrainerConfig
    from ringtrain.train.trainer import Trainer
    from ringtrain.workloads import get_workload

    workload = get_workload("mnist")
    train, _ = workload.datasets(subset=512, seed=0)
    torch.manual_seed(0)
    model = workload.model()
    stamps: list[float] = []

    def on_step(trainer: Trainer) -> None:
        stamps.append(time.perf_counter())
        if trainer.strategy.rank == 1 and len(stamps) == 1:
            time.sleep(LATE)

    config = TrainerConfig(epochs=1, batch_size=32, strategy="horovod", threads=1, progress=False,
                           max_steps_per_epoch=STEPS, task=workload.task)
    strategy = BarrierStrategy()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, optimizer, workload.loss(), train, None, config, on_step=on_step,
                      strategy=strategy)
    try:
        trainer.train()
        rank = trainer.strategy.rank
    finally:
        trainer.close()
    return rank, strategy.barriers, stamps, parameters_digest(model)


def test_barrier_ranks_wait_for_each_other_every_step_and_exchange_no_gradients(ranks2: RankPool) -> None:
    (r0, barriers0, stamps0, digest0), (r1, barriers1, stamps1, digest1) = ranks2.run(_barrier_run,
                                                                                      timeout=300)
    assert (r0, r1) == (0, 1)
    assert barriers0 == barriers1 == STEPS
    assert len(stamps0) == len(stamps1) == STEPS
    # rank 0 could not finish its 2nd step before the late rank 1 reached the same step's barrier
    assert stamps0[1] - stamps0[0] >= LATE * 0.8
    # each rank stepped on its own gradients: the replicas drifted apart (Horovod's would be identical)
    assert digest0 != digest1
