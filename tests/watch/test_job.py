"""The driver's watch over the ranks of every host, fed the agents' marker lines by hand."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ringtrain.watch.diagnosis import RankView
from ringtrain.watch.job import JobWatch
from ringtrain.watch.node import STACKS_MARKER, WATCH_MARKER, WatchSettings


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def views_line(host: str, views: list[RankView], quiet: float, arrivals: dict | None = None) -> str:
    body = {"host": host, "views": [{**asdict(v), "quiet": quiet} for v in views], "arrivals": arrivals or {}}
    return WATCH_MARKER + json.dumps(body)


def rank(r: int, host: str, **fields) -> RankView:
    return RankView(rank=r, pid=100 + r, host=host, progress_time=0.0, **fields)


def make(tmp_path, settings=WatchSettings(hang_timeout=60.0), answer=True):
    clock, said, asked = Clock(), [], []
    watch: JobWatch

    def ask(request: bytes) -> int:
        asked.append(request)
        if answer:
            for host, ranks in (("hostA", [0]), ("hostB", [1])):
                body = {"id": request.decode(), "host": host, "file": f"/tmp/{host}-stacks.txt",
                        "main": {str(r): f'  File "train.py", line {40 + r}, in step\n' for r in ranks},
                        "conditions": {}}
                watch.take(STACKS_MARKER + json.dumps(body))
        return 2

    watch = JobWatch(2, said.append, settings, ask, clock=clock, stacks_wait=0.0, stacks_dir=str(tmp_path))
    return watch, clock, said, asked


def test_the_rank_waited_for_is_named_with_its_host_from_the_agents_lines(tmp_path):
    watch, clock, said, asked = make(tmp_path)
    assert watch.take(views_line("hostA", [rank(0, "hostA", sequence=12, in_library=True)], quiet=0.0))
    assert watch.look() is None, "not every rank seen yet: no decision"
    watch.take(views_line("hostB", [rank(1, "hostB", sequence=11, where=("train.py", 41, "step"),
                                         process="sleeping", cpu=0.0)], quiet=0.0))
    clock.now = 1045.0
    stuck = watch.look()
    assert stuck is not None
    assert [v.host for v in stuck.culprits] == ["hostB"]
    assert len(asked) == 1  # every agent asked once, through the driver's callback
    report = said[0]
    assert "the job waits for rank 1:" in report
    assert "rank 1 on hostB (pid 101) is blocked (no CPU use), at train.py:41 in step" in report
    text = Path(report.split("every rank's stacks: ")[1].splitlines()[0]).read_text()
    assert "=== host hostB: every thread of its ranks in /tmp/hostB-stacks.txt" in text
    assert 'File "train.py", line 41, in step' in text
    clock.now = 1060.0
    watch.look()
    verdict = watch.verdict
    assert verdict is not None
    assert (verdict.rank, verdict.host) == (1, "hostB")
    assert "line 41" in verdict.traceback


def test_an_agent_s_quiet_time_counts_on_the_driver_s_clock(tmp_path):
    watch, clock, said, asked = make(tmp_path)
    clock.now = 5000.0
    watch.take(views_line("hostA", [rank(0, "hostA", sequence=3)], quiet=59.0))
    watch.take(views_line("hostB", [rank(1, "hostB", sequence=2)], quiet=59.0))
    assert watch.look() is not None
    assert "no progress for 59 s" in said[0]


def test_an_agent_that_does_not_answer_is_said_so(tmp_path):
    watch, clock, said, asked = make(tmp_path, answer=False)
    watch.take(views_line("hostA", [rank(0, "hostA", sequence=3)], quiet=0.0))
    watch.take(views_line("hostB", [rank(1, "hostB", sequence=2)], quiet=0.0))
    clock.now = 1100.0
    watch.look()
    text = Path(said[0].split("every rank's stacks: ")[1].splitlines()[0]).read_text()
    assert "=== host hostA: no stacks (no answer from its agent in 0 s)" in text


def test_arrivals_from_two_hosts_name_the_straggler_with_its_host(tmp_path):
    watch, clock, said, asked = make(tmp_path)
    keys = list(range(60))
    watch.take(views_line("hostA", [rank(0, "hostA", sequence=60)], 0.0, {"0": [[k, k * 0.1] for k in keys]}))
    watch.take(views_line("hostB", [rank(1, "hostB", sequence=60)], 0.0,
                          {"1": [[k, k * 0.1 + 0.02] for k in keys]}))
    watch.look()
    assert said == ["ringtrain run: rank 1 on hostB is the slowest: it arrives last at 100 % of 60 "
                    "collectives, 20 ms after the others (median)"]


def test_lines_that_are_not_the_watch_s_are_left_to_the_console(tmp_path):
    watch, *_ = make(tmp_path)
    assert not watch.take("[0] hello")
    assert watch.take(WATCH_MARKER + "{not json")  # a broken line of ours is still not the console's


def test_the_same_progress_sent_again_is_the_same_moment_and_one_report(tmp_path):
    watch, clock, said, asked = make(tmp_path, settings=WatchSettings())
    for now in (1000.0, 1040.0, 1041.3, 1042.9):
        clock.now = now
        quiet = now - 1000.0 + (0.05 if now > 1041 else 0.0)  # a late line: quiet grows by its delay too
        watch.take(views_line("hostA", [rank(0, "hostA", sequence=3)], quiet=quiet))
        watch.take(views_line("hostB", [rank(1, "hostB", sequence=2)], quiet=quiet))
        watch.look()
    assert len(said) == 1
