"""The agent's side of the watch, with the ranks' records written by hand and an injected clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.watch.diagnosis import DEFAULT_HANG_TIMEOUT_S
from ringtrain.watch.node import NodeWatch, ProcessReader, WatchSettings, parse_hang_timeout
from ringtrain.watch.probe import Probe, record_path


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeProcesses(ProcessReader):
    def __init__(self, states: dict[int, tuple[str, float | None]] | None = None) -> None:
        self.states = states or {}

    def read(self, pid: int) -> tuple[str, float | None]:
        return self.states.get(pid, ("sleeping", 0.0))


def write(folder: Path, rank: int, progress: float, sequence: int | None, **extra: object) -> None:
    record = {"rank": rank, "pid": 100 + rank, "time": progress, "progress_time": progress,
              "sequence": sequence, "collective": None, "engine": None,
              "where": ["train.py", 40 + rank, "main"], "innermost": ["train.py", 40 + rank, "main"], **extra}
    record_path(folder, rank).write_text(json.dumps(record))


class Watch(NodeWatch):
    """Answers its own requests for stacks as each rank's probe would."""

    answering: tuple[int, ...] = (0, 1)

    def ask_for_stacks(self, request: str) -> None:
        super().ask_for_stacks(request)
        for rank in self.answering:
            Probe(self.folder, rank)._answer_stacks()


@pytest.fixture
def setup(tmp_path):
    clock, said, ended = Clock(), [], []

    def make(settings: WatchSettings = WatchSettings(), processes: FakeProcesses | None = None) -> Watch:
        return Watch(tmp_path, "node1", lambda: [100, 101], said.append, settings, ended.append, clock=clock,
                     processes=processes or FakeProcesses(), stacks_wait=0.0, stacks_dir=str(tmp_path))

    return tmp_path, clock, said, ended, make


def test_a_stuck_job_is_told_once_with_every_rank_s_stacks_in_a_file(setup):
    folder, clock, said, ended, make = setup
    watch = make(WatchSettings(hang_timeout=60.0))
    write(folder, 0, 1000.0, 12, collective={"op": "all_reduce", "sizes": [[3]]})
    write(folder, 1, 1000.0, 11)
    clock.now = 1029.0
    assert watch.look() is None
    assert said == []
    clock.now = 1030.0
    assert watch.look() is not None
    clock.now = 1031.0
    watch.look()
    assert len(said) == 1, "one report per stuck spell"
    report = said[0]
    assert "the job waits for rank 1:" in report
    assert "train.py:41 in main" in report
    assert "rank 0 waits in all_reduce #12" in report
    stacks_file = report.split("every rank's stacks: ")[1].splitlines()[0]
    text = Path(stacks_file).read_text()
    assert "=== rank 0 on node1 (pid 100)" in text
    assert "=== rank 1 on node1 (pid 101)" in text
    assert "test_node.py" in text  # the answering "probe" is this test's own thread
    assert ended == []


def test_the_hang_timeout_ends_the_ranks_waited_for_with_a_verdict(setup):
    folder, clock, said, ended, make = setup
    watch = make(WatchSettings(hang_timeout=60.0))
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1059.0
    watch.look()
    assert ended == []
    clock.now = 1060.0
    watch.look()
    assert ended == [[101]]
    verdict = watch.verdict
    assert verdict is not None
    assert verdict.rank == 1
    assert verdict.pid == 101
    assert verdict.message.startswith("stuck: rank 1 blocked (no CPU use) at train.py:41 in main")
    assert "ended by the hang timeout, 60 s" in verdict.message
    assert "Thread" not in verdict.traceback
    assert "test_node.py" in verdict.traceback
    watch.look()
    assert ended == [[101]], "ended once"
    assert watch.forget_verdict() == verdict
    assert watch.verdict is None


def test_by_default_a_busy_rank_is_not_ended_but_a_blocked_one_is(setup):
    folder, clock, said, ended, make = setup
    busy = make(processes=FakeProcesses({101: ("running", 0.95)}))
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1000.0 + DEFAULT_HANG_TIMEOUT_S + 5
    busy.look()
    assert ended == []
    assert "busy (95 % of a core)" in said[0]
    assert "the job goes on" in said[0]
    blocked = make()
    blocked.look()
    assert ended == [], "two looks in a row must agree before the job ends"
    blocked.look()
    assert ended == [[101]]


def test_an_explicit_hang_timeout_ends_a_busy_rank_too(setup):
    folder, clock, said, ended, make = setup
    watch = make(WatchSettings(hang_timeout=30.0), FakeProcesses({101: ("running", 0.95)}))
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1031.0
    watch.look()
    watch.look()
    assert ended == [[101]]


def test_progress_after_a_report_is_said_and_a_new_spell_is_told_again(setup):
    folder, clock, said, ended, make = setup
    watch = make()
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1040.0
    watch.look()
    write(folder, 1, 1041.0, 12)
    clock.now = 1041.0
    watch.look()
    assert said[-1] == "ringtrain run: the job makes progress again after 41 s without"
    write(folder, 0, 1042.0, 13)
    clock.now = 1200.0
    watch.look()
    assert len(said) == 3
    assert "the job waits for rank 1" in said[-1]


def test_records_of_other_processes_are_not_read(setup):
    folder, clock, said, ended, make = setup
    watch = make()
    write(folder, 0, 1000.0, 12)
    record = json.loads(record_path(folder, 0).read_text())
    record_path(folder, 1).write_text(json.dumps({**record, "rank": 1, "pid": 999, "sequence": 2}))
    clock.now = 5000.0
    assert watch.look() is None  # rank 1's record is an earlier attempt's


def test_a_rank_that_does_not_answer_is_said_so_in_the_stacks_file(setup):
    folder, clock, said, ended, make = setup
    watch = make(processes=FakeProcesses({101: ("stopped", 0.0)}))
    watch.answering = (0,)
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1100.0
    watch.look()
    assert "rank 1 on node1 (pid 101) is stopped (SIGSTOP" in said[0]
    text = Path(said[0].split("every rank's stacks: ")[1].splitlines()[0]).read_text()
    assert "(no stack: it is stopped)" in text


def test_process_reader_reads_this_process(tmp_path):
    import os

    reader = ProcessReader()
    state, cpu = reader.read(os.getpid())
    assert state == "running"
    assert cpu is None
    state, cpu = reader.read(os.getpid())
    assert cpu is not None
    assert cpu >= 0.0
    assert reader.read(2**22 + 12345)[0] == "gone"


@pytest.mark.parametrize("text", ["0", "-5", "abc", "inf", "nan", ""])
def test_a_bad_hang_timeout_names_the_value_and_the_fix(text):
    words = rf"--hang-timeout '{text}' is not a positive number of seconds\. HINT"
    with pytest.raises(ValueError, match=words):
        parse_hang_timeout(text)


def test_settings_from_the_launcher_s_variables():
    assert WatchSettings.from_env({}) == WatchSettings(enabled=True, hang_timeout=None)
    assert WatchSettings.from_env({"RINGTRAIN_WATCH": "0"}).enabled is False
    assert WatchSettings.from_env({"RINGTRAIN_NO_WATCH": "1"}).enabled is False  # as ringtrain train reads it
    assert WatchSettings.from_env({"RINGTRAIN_HANG_TIMEOUT": "45"}).hang_timeout == 45.0
    # Horovod's stall shutdown is the hang timeout of a watched job
    assert WatchSettings.from_env({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "20"}).hang_timeout == 20.0
    assert WatchSettings.from_env({"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}).hang_timeout is None


def test_a_straggler_is_said_once_while_it_stays_and_again_in_the_run_s_summary(setup):
    folder, clock, said, ended, make = setup
    watch = make()
    for look in range(3):
        seqs = range(look * 40, look * 40 + 40)
        write(folder, 0, 1000.0 + look, 40 * look + 40, arrivals=[[s, s * 0.1] for s in seqs])
        write(folder, 1, 1000.0 + look, 40 * look + 40, arrivals=[[s, s * 0.1 + 0.05] for s in seqs])
        clock.now = 1000.0 + look
        watch.look()
    lines = [line for line in said if "slowest" in line]
    assert lines == ["ringtrain run: rank 1 on node1 is the slowest: it arrives last at 100 % of 80 "
                     "collectives, 50 ms after the others (median)"]
    watch.stop()
    assert said[-1].startswith("ringtrain run: over the whole run, rank 1 on node1 is the slowest")
    assert "of 120 collectives" in said[-1]


def test_the_horovod_engine_s_requests_tell_the_straggler_by_name_and_occurrence(setup):
    folder, clock, said, ended, make = setup
    watch = make()
    names = [f"allreduce.w#{n}" for n in range(1, 61)]
    engine0 = {"done": 60, "pending": [], "pending_count": 0,
               "arrivals": [[k, i * 0.1] for i, k in enumerate(names)]}
    engine1 = {**engine0, "arrivals": [[k, i * 0.1 + 0.03] for i, k in enumerate(names)]}
    write(folder, 0, 1000.0, None, engine=engine0)
    write(folder, 1, 1000.0, None, engine=engine1)
    watch.look()
    assert said == ["ringtrain run: rank 1 on node1 is the slowest: it arrives last at 100 % of 60 "
                    "collectives, 30 ms after the others (median)"]


def test_the_job_ends_only_on_a_diagnosis_two_looks_in_a_row_agree_on(setup):
    folder, clock, said, ended, make = setup
    watch = make(WatchSettings(hang_timeout=10.0))
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 11)
    clock.now = 1020.0
    watch.look()  # rank 1 waited for
    write(folder, 0, 1000.0, 12)
    write(folder, 1, 1000.0, 13)  # a newer record: now rank 0 is behind
    watch.look()
    assert ended == []
    watch.look()
    assert ended == [[100]]
