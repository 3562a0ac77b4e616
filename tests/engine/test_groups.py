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


class _DeviceGroup:
    """Stands in for a ProcessGroupNCCL (the CPU build of torch has none): records how it was ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def shutdown(self) -> None:
        self.ended.append("shutdown")

    def abort(self) -> None:
        self.ended.append("abort")


def test_device_groups_are_shut_down_after_a_clean_stop_and_aborted_after_a_failure():
    world = World(0, 1, 0, 1, 0, 1, "localhost", dist.HashStore(), False)
    groups = EngineGroups(world, Settings())
    for failed, expected in ((False, "shutdown"), (True, "abort")):
        set_id = groups.add_set([0])
        device_group = _DeviceGroup()
        groups.sets[set_id].make_nccl = lambda group=device_group: group
        assert groups.sets[set_id].group(0) is device_group  # built at the set's first CUDA collective
        groups.close_device_groups(failed=failed)
        assert device_group.ended == [expected]
        assert groups.sets[set_id].nccl is None
        groups.close_device_groups(failed=failed)  # a second stop ends nothing twice
        assert device_group.ended == [expected]
        groups.remove_set(set_id)
