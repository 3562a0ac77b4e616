"""Who a stuck job waits for, decided from the ranks' records alone."""

from __future__ import annotations

import threading

import pytest

from ringtrain.watch.diagnosis import (
    WARN_MAX_S,
    WARN_MIN_S,
    RankView,
    WarnTime,
    diagnose,
    format_stuck,
    rank_ranges,
    summary,
)


def view(rank: int, progress: float = 100.0, **fields: object) -> RankView:
    return RankView(rank=rank, pid=1000 + rank, host="node1", progress_time=progress, **fields)  # type: ignore[arg-type]


ALL_REDUCE = {"op": "all_reduce", "sizes": [[11]]}


@pytest.mark.parametrize(("ranks", "text"), [
    ([0], "0"), ([0, 1, 2], "0-2"), ([0, 2, 3, 4, 5, 6, 7], "0, 2-7"), ([5, 1, 3], "1, 3, 5"), ([], ""),
])
def test_rank_ranges(ranks, text):
    assert rank_ranges(ranks) == text


def test_nothing_is_stuck_before_the_warning_time():
    views = [view(0, 100.0, sequence=12, collective=ALL_REDUCE), view(1, 95.0, sequence=11)]
    assert diagnose(views, now=129.0, warn_after=30.0) is None
    assert diagnose(views, now=130.0, warn_after=30.0) is not None


def test_the_rank_with_fewer_collectives_is_the_one_waited_for():
    views = [view(0, sequence=12, collective=ALL_REDUCE, in_library=True),
             view(1, sequence=11, where=("train.py", 42, "step"), cpu=0.0, process="sleeping"),
             view(2, sequence=12, in_library=True), view(3, sequence=12, in_library=True)]
    stuck = diagnose(views, now=200.0, warn_after=30.0)
    assert stuck is not None
    assert stuck.kind == "behind"
    assert [v.rank for v in stuck.culprits] == [1]
    assert stuck.waiting == (("wait in all_reduce #12 (sizes [[11]])", (0, 2, 3)),)
    assert not stuck.busy()
    text = format_stuck(stuck, now=200.0)
    assert "the job waits for rank 1:" in text
    assert "rank 1 on node1 (pid 1001) is blocked (no CPU use), at train.py:42 in step" in text
    assert "ranks 0, 2-3 wait in all_reduce #12" in text
    assert "no progress for 100 s" in text


def test_one_waiting_rank_reads_in_the_singular():
    stuck = diagnose([view(0, sequence=3, collective=ALL_REDUCE), view(1, sequence=2)], 200.0, 30.0)
    assert stuck is not None
    assert "rank 0 waits in all_reduce #3" in format_stuck(stuck, 200.0)
    assert summary(stuck) == ("stuck: rank 1 making no progress outside the script's own code; "
                              "rank 0 waits in all_reduce #3 (sizes [[11]])")


@pytest.mark.parametrize(("fields", "words"), [
    ({"process": "stopped"}, "stopped (SIGSTOP"),
    ({"process": "disk"}, "uninterruptible sleep"),
    ({"process": "gone"}, "gone"),
    ({"process": "running", "cpu": 0.97}, "busy (97 % of a core)"),
    ({"process": "sleeping", "cpu": 0.01}, "blocked (no CPU use)"),
    ({}, "making no progress"),
])
def test_the_rank_waited_for_is_described_by_its_process(fields, words):
    stuck = diagnose([view(0, sequence=3), view(1, sequence=2, **fields)], 200.0, 30.0)
    assert stuck is not None
    assert words in format_stuck(stuck, 200.0)


def test_a_busy_rank_waited_for_is_busy_not_hung():
    stuck = diagnose([view(0, sequence=3), view(1, sequence=2, process="running", cpu=0.9)], 200.0, 30.0)
    assert stuck is not None
    assert stuck.busy()


def test_different_collectives_under_one_number_are_a_mismatch_with_both_sides():
    views = [view(0, sequence=7, collective={"op": "all_reduce", "sizes": [[1000]]}, in_library=True),
             view(1, sequence=7, collective={"op": "broadcast", "sizes": [[1000]]}, in_library=True)]
    stuck = diagnose(views, 200.0, 30.0)
    assert stuck is not None
    assert stuck.kind == "mismatch"
    text = format_stuck(stuck, 200.0)
    assert "rank 0 is in all_reduce #7" in text
    assert "rank 1 is in broadcast #7" in text
    assert "different collectives" in text


def test_the_same_collective_with_different_sizes_is_a_mismatch():
    views = [view(0, sequence=7, collective={"op": "all_reduce", "sizes": [[10]]}),
             view(1, sequence=7, collective={"op": "all_reduce", "sizes": [[12]]})]
    stuck = diagnose(views, 200.0, 30.0)
    assert stuck is not None
    assert stuck.kind == "mismatch"


def test_every_rank_inside_one_collective_is_a_stuck_transport():
    views = [view(r, sequence=7, collective=ALL_REDUCE, in_library=True) for r in range(3)]
    stuck = diagnose(views, 200.0, 30.0)
    assert stuck is not None
    assert stuck.kind == "all waiting"
    assert stuck.culprits == ()
    assert "ranks 0-2 are in all_reduce #7" in format_stuck(stuck, 200.0)


def test_ranks_all_in_their_own_code_with_one_count_are_not_stuck():
    """Every rank computing (or loading data) between collectives: nobody waits for anybody."""
    views = [view(r, sequence=7, where=("train.py", 10, "main")) for r in range(2)]
    assert diagnose(views, 1000.0, 30.0) is None


def test_ranks_before_their_first_collective_are_not_stuck():
    assert diagnose([view(0), view(1)], 1000.0, 30.0) is None


def test_horovod_engine_ranks_with_a_pending_request_wait_for_those_without():
    views = [view(0, engine_pending=("allreduce.fc.weight",)), view(1, engine_pending=()),
             view(2, engine_pending=("allreduce.fc.weight",))]
    stuck = diagnose(views, 200.0, 30.0)
    assert stuck is not None
    assert [v.rank for v in stuck.culprits] == [1]
    assert "ranks 0, 2 wait in the Horovod engine for allreduce.fc.weight" in format_stuck(stuck, 200.0)


def test_horovod_engine_ranks_all_waiting_for_the_same_names_are_not_blamed_on_each_other():
    views = [view(0, engine_pending=("a",)), view(1, engine_pending=("a",))]
    assert diagnose(views, 200.0, 30.0) is None


def test_the_warning_time_follows_the_job_s_pauses_within_its_bounds():
    pace = WarnTime()
    assert pace.seconds() == WARN_MIN_S
    for t in (0.0, 0.5, 1.0, 1.5):
        pace.saw_progress(t)
    assert pace.seconds() == WARN_MIN_S  # fast steps: the floor
    pace.saw_progress(6.5)  # a 5 s pause (an evaluation, say)
    assert pace.seconds() == 50.0
    pace.saw_progress(100.0)
    assert pace.seconds() == WARN_MAX_S
    assert pace.seconds(hang_timeout=8.0) == 8.0  # never after the hang timeout
    pace.saw_progress(50.0)  # an older record read late changes nothing
    assert pace.longest == 93.5


def test_a_rank_waiting_on_its_own_lock_is_not_inside_a_collective():
    """The same count on both ranks, one blocked on a threading lock, the other's newer collective not
    heard yet: not 'every rank inside one collective', which would end the job naming the wrong rank."""
    record = {"rank": 1, "pid": 7, "progress_time": 1.0, "sequence": 7,
              "innermost": [threading.__file__, 320, "wait"], "where": ["train.py", 23, "get_stuck"]}
    assert RankView.from_record(record, "hostB").in_library is False
    graph = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"
    torch_frame = {**record, "innermost": [graph, 9, "x"]}
    assert RankView.from_record(torch_frame, "hostA").in_library is True


def test_a_frame_read_between_lines_still_gives_a_view():
    """A frame read from another thread may run an instruction of no line (``f_lineno`` None): the
    probe then names the function's first line, and a record with no line is still read (it once
    stopped the watch with a TypeError)."""
    from types import SimpleNamespace

    from ringtrain.watch.probe import line_of

    code = SimpleNamespace(co_firstlineno=40, co_filename="train.py", co_name="step")
    assert line_of(SimpleNamespace(f_lineno=None, f_code=code)) == 40  # type: ignore[arg-type]
    assert line_of(SimpleNamespace(f_lineno=42, f_code=code)) == 42  # type: ignore[arg-type]
    record = {"rank": 1, "pid": 7, "progress_time": 1.0, "sequence": 7, "where": ["train.py", None, "step"]}
    assert RankView.from_record(record, "hostB").where == ("train.py", 0, "step")
