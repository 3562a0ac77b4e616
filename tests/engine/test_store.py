"""Rendezvous and the engine's own process groups (engine/store.py), in one process and in two."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine import store
from ringtrain.env.single import SingleProcessEnvironment
from ringtrain.env.torchrun import EnvVarsEnvironment
from tests.ranks import free_port, run_ranks


@pytest.fixture
def alone(monkeypatch):
    """This process as a world of one, whatever the test runner's environment holds."""
    assert not (dist.is_available() and dist.is_initialized()), "a default process group leaked"
    monkeypatch.setattr(store, "detect_environment", lambda: SingleProcessEnvironment({}))


def test_a_single_process_needs_no_network(alone):
    world = store.rendezvous(timeout_s=5.0)
    assert (world.rank, world.size, world.local_rank, world.local_size) == (0, 1, 0, 1)
    assert (world.cross_rank, world.cross_size) == (0, 1)
    assert not world.reused_torch_world
    world.store.set("key", "value")
    assert world.store.get("key") == b"value"


def test_each_rendezvous_is_a_new_generation_on_the_same_base_store(alone):
    first = store.rendezvous(timeout_s=5.0)
    first.store.set("seen", "1")
    second = store.rendezvous(timeout_s=5.0)
    # A key of an earlier generation is invisible to the next one: nothing of a dead attempt is read.
    with pytest.raises(dist.DistStoreError):
        second.store.wait(["seen"], datetime.timedelta(milliseconds=50))
    assert first.store.get("seen") == b"1"


def test_gloo_group_of_one_and_nonmembers(alone):
    world = store.rendezvous(timeout_s=5.0)
    group = store.make_gloo_group(world, "unit", [0], timeout_s=5.0)
    tensor = torch.ones(3)
    group.allreduce([tensor]).wait()
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    assert store.make_gloo_group(world, "unit-other", [1, 2], timeout_s=5.0) is None
    assert store.make_nccl_group(world, "unit-other", [1], timeout_s=5.0) is None


def test_an_unreachable_store_names_address_rank_and_fix(monkeypatch):
    port = free_port()  # nothing listens there
    environ = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    monkeypatch.setattr(store, "detect_environment", lambda: EnvVarsEnvironment(environ))
    with pytest.raises(ValueError, match=rf"cannot reach the rendezvous store at 127\.0\.0\.1:{port} "
                                         r"\(rank 1 of 2\).*HINT: check MASTER_ADDR/MASTER_PORT"):
        store.rendezvous(timeout_s=1.0)


def test_under_torchrun_rank_zero_does_not_host_the_store(monkeypatch):
    """With TORCHELASTIC_USE_AGENT_STORE the agent hosts it: rank 0 connects like everyone else."""
    port = free_port()
    environ = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    monkeypatch.setattr(store, "detect_environment", lambda: EnvVarsEnvironment(environ))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(ValueError, match=r"cannot reach the rendezvous store .*\(rank 0 of 2\)"):
        store.rendezvous(timeout_s=1.0)


def _two_rank_rendezvous() -> dict:
    world = store.rendezvous(timeout_s=30.0)
    world.store.set(f"from{world.rank}", str(world.rank))
    other = world.store.get(f"from{1 - world.rank}").decode()
    group = store.make_gloo_group(world, "pair", [0, 1], timeout_s=30.0)
    tensor = torch.tensor([float(world.rank + 1)])
    group.allreduce([tensor]).wait()
    return {"rank": world.rank, "size": world.size, "local_size": world.local_size, "other": other,
            "sum": tensor.item(), "address": world.main_address}


def test_two_ranks_meet_through_rank_zeros_store():
    results = run_ranks(2, _two_rank_rendezvous)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["local_size"] == 2 for r in results)
    assert [r["other"] for r in results] == ["1", "0"]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert all(r["address"] == "127.0.0.1" for r in results)
