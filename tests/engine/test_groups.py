"""The engine's groups in a world of one: ids in order, the global set on the control group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ringtrain.engine.groups import EngineGroups
from ringtrain.engine.settings import Settings
from ringtrain.engine.world_rendezvous import World


def test_sets_get_ids_in_order_and_the_global_one_stays():
    world = World(0, 1, 0, 1, 0, 1, "localhost", dist.HashStore(), False)
    groups = EngineGroups(world, Settings(fusion_threshold_bytes=1024))
    assert groups.plane is None  # one process: no mesh to build
    assert not groups.cpu_ring
    assert groups.add_set([0]) == 0
    assert groups.add_set([0]) == 1
    assert groups.sets[0].gloo is groups.ctrl  # the global set's data shares the control group
    assert groups.sets[1].gloo is not groups.ctrl
    assert groups.sets[1].extra["set_rank"] == 0
    assert groups.sets[1].keep_bytes == 1024
    tensor = torch.ones(2)
    groups.sets[1].group(-1).allreduce([tensor]).wait()
    assert tensor.tolist() == [1.0, 1.0]
    assert groups.is_homogeneous()
    assert not groups.remove_set(0)
    assert groups.remove_set(1)
    assert not groups.remove_set(1)
    assert sorted(groups.sets) == [0]
    assert groups.add_set([0]) == 2  # ids are never reused
