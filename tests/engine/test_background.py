"""The background engine as a whole: idle cost, waiting cost, a dead peer, a lone process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import ringtrain.mpi_ops as hvd
from tests.engine.hvd_env import ensure_init
from tests.ranks import free_port, rank_env

REPO = Path(__file__).resolve().parents[2]


def _cpu_while(seconds: float, busy_rank: int | None = None) -> float:
    """Process CPU seconds used per wall second while the main thread only sleeps or waits."""
    ensure_init()
    hvd.allreduce(torch.ones(1), name="warm")
    hvd.barrier()
    start_cpu, start = time.process_time(), time.monotonic()
    if busy_rank is None:
        time.sleep(seconds)
    elif hvd.rank() == busy_rank:
        time.sleep(seconds)  # "computing"; the other rank waits for it inside synchronize()
        hvd.allreduce(torch.ones(1), name="late")
    else:
        hvd.allreduce(torch.ones(1), name="late")
    used = (time.process_time() - start_cpu) / (time.monotonic() - start)
    hvd.barrier()
    return used


def test_idle_engine_does_not_burn_cpu(ranks2):
    usage = ranks2.run(_cpu_while, 2.0)
    assert max(usage) < 0.02, f"idle engine used {usage} of a core"


def test_waiting_for_a_slow_rank_does_not_burn_cpu(ranks2):
    usage = ranks2.run(_cpu_while, 2.0, 1)
    assert usage[0] < 0.05, f"rank 0 used {usage[0]:.3f} of a core while waiting"
    assert usage[1] < 0.05, f"rank 1 used {usage[1]:.3f} of a core while computing"


_DEAD_PEER = textwrap.dedent("""
    import os, sys, torch
    import ringtrain.mpi_ops as hvd
    from ringtrain.exceptions import HorovodInternalError
    torch.set_num_threads(1)
    hvd.init()
    hvd.allreduce(torch.ones(1), name="warm")
    if hvd.rank() == 1:
        os._exit(7)
    handle = hvd.allreduce_async(torch.ones(1), name="after")
    try:
        hvd.synchronize(handle)
        print("NO ERROR")
    except HorovodInternalError as exc:
        print("HorovodInternalError:", exc)
    try:
        hvd.allreduce(torch.ones(1), name="again")
    except HorovodInternalError:
        print("still failing")
    hvd.shutdown()
    print("shut down")
""")


@pytest.mark.slow
def test_dead_peer_surfaces_as_horovod_internal_error():
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, **rank_env(rank, 2, port), "PYTHONPATH": str(REPO / "src")}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _DEAD_PEER],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        out0, _ = procs[0].communicate(timeout=120)
        procs[1].communicate(timeout=30)
    finally:
        for proc in procs:
            proc.kill()
    assert procs[1].returncode == 7
    assert "HorovodInternalError: Horovod has been shut down" in out0, out0
    assert "still failing" in out0
    assert "shut down" in out0


_ALONE = textwrap.dedent("""
    import torch
    import ringtrain.mpi_ops as hvd
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    assert hvd.allreduce(torch.ones(3)).tolist() == [1.0] * 3
    assert hvd.allgather(torch.ones(2, 2)).shape == (2, 2)
    assert hvd.broadcast(torch.arange(3), 0).tolist() == [0, 1, 2]
    assert hvd.alltoall(torch.arange(4)).tolist() == [0, 1, 2, 3]
    assert hvd.reducescatter(torch.ones(3), op=hvd.Sum).tolist() == [1.0] * 3
    hvd.barrier()
    assert hvd.join() == 0
    hvd.shutdown()
    hvd.init()
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 1.0
    print("ok")
""")


def test_single_process_needs_no_launcher_or_network():
    launcher_vars = {
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "TORCHELASTIC_RUN_ID",
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in launcher_vars and not k.startswith(("HOROVOD_", "OMPI_", "PMI", "SLURM_"))
    }
    env["PYTHONPATH"] = str(REPO / "src")
    result = subprocess.run(
        [sys.executable, "-c", _ALONE], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    # the last line: some torch releases' gloo prints its own connection line on stdout first (2.10)
    assert result.stdout.strip().splitlines()[-1:] == ["ok"], result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("size", [2])
def test_reuses_a_torch_distributed_world(size):
    """A user who set up torch.distributed keeps it: init() shares its store, shutdown() leaves it."""
    script = textwrap.dedent("""
        import torch, torch.distributed as dist
        import ringtrain.mpi_ops as hvd
        dist.init_process_group("gloo")
        hvd.init()
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == dist.get_world_size()
        hvd.shutdown()
        t = torch.ones(1)
        dist.all_reduce(t)
        assert dist.is_initialized() and t.item() == dist.get_world_size()
        hvd.init()
        hvd.barrier()
        hvd.shutdown()
        dist.destroy_process_group()
        print("ok")
    """)
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **rank_env(rank, size, port), "PYTHONPATH": str(REPO / "src")},
        )
        for rank in range(size)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            proc.kill()
    assert all(out.strip().endswith("ok") for out in outputs), outputs


def _rounds_while_the_other_waits(seconds: float) -> int:
    """Rounds rank 0 takes part in while it "computes" and rank 1 waits for it inside an allreduce."""
    from ringtrain.engine import state

    ensure_init()
    hvd.allreduce(torch.ones(1), name="warm")
    hvd.barrier()
    controller = state.require().controller
    if hvd.rank() == 1:
        hvd.allreduce(torch.ones(1), name="late")
        hvd.barrier()
        return -1
    # Rank 1's request reaches rank 0 in the first round rank 0 takes part in: wait for that round
    # (the idle period's, at most a second away), then count what follows while rank 0 stays busy.
    deadline = time.monotonic() + 30
    while not controller.others_pending:
        assert time.monotonic() < deadline, "rank 1's request never showed in rank 0's rounds"
        time.sleep(0.01)
    before = controller.rounds
    time.sleep(seconds)  # "computing": nothing of rank 0's own is pending
    during = controller.rounds - before
    hvd.allreduce(torch.ones(1), name="late")
    hvd.barrier()
    return during


def test_a_rank_with_nothing_pending_runs_no_rounds_while_another_waits_for_it(ranks2):
    # Rounds paced every few milliseconds would take CPU from the very rank the others wait for; its
    # own submission wakes it instead. The idle period (1 s) may still bring one round in 1.5 s.
    during = ranks2.run(_rounds_while_the_other_waits, 1.5)[0]
    assert during <= 2, f"rank 0 ran {during} rounds while rank 1 waited on it"
