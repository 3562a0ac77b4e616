"""The controller on its own: one process, a real gloo group of one, no background thread.

Each test drives ``Controller.negotiate`` by hand and checks the named result of the round; the
multi-rank behaviour (matching by name, mismatches, join, stalls across ranks) is tested through the
API in tests/test_mpi_ops*.py and tests/engine/test_stall.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine.controller import IDLE, Controller, RoundResult, display_name
from ringtrain.engine.executor import SetGroups
from ringtrain.engine.requests import AVERAGE, SUM, OpType, Request, RequestMeta, Response
from ringtrain.engine.settings import Settings
from ringtrain.engine.timeline import Timeline
from ringtrain.engine.world_rendezvous import World, make_gloo_group


class Harness:
    """A controller of rank 0 in a world of one, collecting what it completes itself."""

    def __init__(self, settings: Settings | None = None, sets: dict[int, list[int]] | None = None) -> None:
        world = World(0, 1, 0, 1, 0, 1, "localhost", dist.HashStore(), False)
        ctrl = make_gloo_group(world, "control", [0], timeout_s=10.0)
        self.sets = {
            set_id: SetGroups(set_id=set_id, ranks=ranks, gloo=ctrl, make_nccl=lambda: None)
            for set_id, ranks in (sets or {0: [0]}).items()
        }
        self.completed: list[tuple[Request | None, str | None]] = []
        self.controller = Controller(0, 1, settings or Settings(), self.sets, Timeline(), ctrl, None,
                                     lambda request, error: self.completed.append((request, error)))
        self._handle = 0

    def request(self, key: str, tensor: torch.Tensor, set_id: int = 0, op: int = SUM,
                prescale: float = 1.0, postscale: float = 1.0) -> Request:
        meta = RequestMeta(key=key, names=(key,), op=OpType.ALLREDUCE, set_id=set_id,
                           dtypes=(str(tensor.dtype).replace("torch.", ""),), shapes=(tuple(tensor.shape),),
                           reduce_op=op, prescale=prescale, postscale=postscale)
        self._handle += 1
        return Request(meta=meta, handle=self._handle, inputs=[tensor], outputs=[None])

    def round(self, *new: Request, joining: bool = False, stopping: bool = False) -> RoundResult:
        return self.controller.negotiate(list(new), joining, stopping)


def test_a_new_name_is_ready_at_once_in_a_world_of_one_and_gets_cached():
    h = Harness()
    request = h.request("allreduce.a", torch.ones(3))
    result = h.round(request)
    assert [(response.key, req) for response, req in result.ready] == [("allreduce.a", request)]
    assert result.ready[0][0].error is None
    assert result.progress
    assert not result.mine_pending
    assert not result.shutdown
    assert result.last_joined is None
    assert h.controller.cache.lookup(0, "allreduce.a") == 0
    assert h.controller.pending == {}


def test_a_cached_small_allreduce_completes_inside_the_round():
    h = Harness()
    h.round(h.request("allreduce.m", torch.ones(2)))
    again = h.request("allreduce.m", torch.tensor([2.0, 4.0]), op=AVERAGE)
    # Different metadata (op) is renegotiated; the same metadata rides in the round vector.
    h.round(again)
    same = h.request("allreduce.m", torch.tensor([2.0, 4.0]), op=AVERAGE)
    result = h.round(same)
    assert result.ready == []  # nothing left for the executor ...
    assert h.completed == [(same, None)]  # ... the controller completed it
    assert same.outputs[0].tolist() == [2.0, 4.0]  # the average over a world of one
    assert h.controller.eager_size == 2
    assert result.progress


def test_without_eager_room_a_cached_name_goes_to_the_executor():
    h = Harness(Settings(eager_elements=0))
    h.round(h.request("allreduce.m", torch.ones(2)))
    again = h.request("allreduce.m", torch.ones(2))
    result = h.round(again)
    assert [req for _, req in result.ready] == [again]
    assert h.completed == []
    assert h.controller.eager_size == 0


def test_a_name_of_a_removed_process_set_fails_with_a_named_error():
    h = Harness()
    request = h.request("allreduce.gone", torch.ones(1), set_id=7)
    result = h.round(request)
    assert [(response.error, req) for response, req in result.ready] == [
        ("Process set 7 has been removed.", request)
    ]


def test_join_of_the_only_rank_completes_in_its_round():
    h = Harness()
    result = h.round(joining=True)
    assert result.joined == {0}
    assert result.last_joined == 0
    assert result.progress
    assert not result.mine_pending


def test_a_stopping_rank_ends_the_rounds_and_an_idle_round_moves_nothing():
    h = Harness()
    assert h.round(stopping=True).shutdown
    idle = h.round()
    assert (idle.progress, idle.mine_pending, idle.others_pending, idle.all_pending, idle.shutdown) == (
        False, False, False, False, False)
    assert idle.ready == []


def test_a_name_waiting_for_a_missing_rank_is_reported_and_shuts_down_after_the_stall_time(caplog):
    h = Harness(Settings(stall_check_time_s=0.01, stall_shutdown_time_s=0.02), sets={0: [0], 1: [0, 1]})
    request = h.request("allreduce.lonely", torch.ones(1), set_id=1)
    result = h.round(request)
    assert result.ready == []
    assert result.mine_pending
    time.sleep(0.05)  # the stall times are what is under test
    with caplog.at_level(logging.WARNING, logger="ringtrain.engine.stall"):
        assert h.controller.stalled(result.joined)
    assert "Missing ranks:\n1: [allreduce.lonely (process set 1)]" in caplog.text


def test_the_result_is_a_named_dataclass_and_idle_is_the_first_pacing_state():
    assert [f.name for f in dataclasses.fields(RoundResult)] == [
        "ready", "joined", "last_joined", "progress", "mine_pending", "others_pending", "all_pending",
        "others_need_rounds", "shutdown"]
    assert (IDLE.progress, IDLE.mine_pending, IDLE.others_pending, IDLE.shutdown) == (False,) * 4


@pytest.mark.parametrize(("ident", "shown"), [((0, "allreduce.x"), "allreduce.x"),
                                              ((3, "allreduce.x"), "allreduce.x (process set 3)")])
def test_display_name(ident, shown):
    assert display_name(ident) == shown


def test_others_need_this_ranks_rounds_only_for_names_of_sets_without_it():
    h = Harness(sets={0: [0], 1: [0, 1], 2: [1, 2]})
    controller = h.controller
    mine = h.request("allreduce.mine", torch.ones(1), set_id=1).meta
    theirs = h.request("allreduce.theirs", torch.ones(1), set_id=2).meta
    assert not controller._waiting_without_me([])
    # Metadata another rank sent: a set with rank 0 waits for rank 0's submission, not its rounds.
    controller._table[(1, mine.key)] = {1: mine}
    assert not controller._waiting_without_me([])
    controller._table[(2, theirs.key)] = {1: theirs}
    assert controller._waiting_without_me([])
    controller._table.clear()
    controller._table[(9, "allreduce.unknown")] = {1: mine}  # a set this rank does not know
    assert controller._waiting_without_me([])
    controller._table.clear()
    # Cached names count by slot: only slots that some rank counted this round matter.
    slot_mine = controller.cache.insert(Response(mine.key, 1, OpType.ALLREDUCE, {1: mine}))
    slot_theirs = controller.cache.insert(Response(theirs.key, 2, OpType.ALLREDUCE, {1: theirs}))
    counts = [0] * controller.cache.num_slots
    counts[slot_mine] = 1
    assert not controller._waiting_without_me(counts)
    counts[slot_theirs] = 2
    assert controller._waiting_without_me(counts)
