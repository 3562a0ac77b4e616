"""The console of ``ringtrain run``: whole prefixed lines, rank 0's progress bar live on a terminal,
a few lines per bar in a file or a pipe; seen as a person sees it (a pseudo-terminal) and in a pipe."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.launch.logs import ConsoleRelay, RedrawnLine
from tests.terminal import PtyRun, Screen

SCRIPTS = Path(__file__).resolve().parent / "scripts"
BARS = str(SCRIPTS / "progress_bars.py")
PREFIX = re.compile(r"\[\d+\] ")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TerminalStream(io.StringIO):
    """A console that says it is a terminal (80 columns: it has no descriptor to ask)."""

    def isatty(self) -> bool:
        return True


def test_redrawn_line_splits_lines_and_keeps_the_states_of_a_bar():
    line = RedrawnLine()
    assert line.feed(b"hello\nhalf") == [("line", "hello")]
    assert line.current() == "half"
    assert line.feed(b" line\n\r10%\r20%") == [("line", "half line"), ("update", ""), ("update", "10%")]
    assert line.current() == "20%"
    # a terminal overwrites from the start of the line: "abcdef" then "\rXY" reads "XYcdef"
    assert line.feed(b"\rabcdef\rXY\n") == [("update", "20%"), ("update", "abcdef"), ("line", "XYcdef")]
    # a bar cleared with blanks (tqdm's leave=False) leaves no line; an empty print() does
    assert line.feed(b"\r50%\r   \r\n\n") == [("update", ""), ("update", "50%"), ("update", ""),
                                               ("line", "")]


def relay_of(tmp_path: Path, stdout, stderr, clock=None, ranks=(0, 1)) -> tuple[ConsoleRelay, dict]:
    relay = ConsoleRelay(stdout, stderr, interval_s=10.0, clock=clock or FakeClock())
    files = {r: (str(tmp_path / f"{r}.out"), str(tmp_path / f"{r}.err")) for r in ranks}
    relay.follow(files)
    return relay, files


def append(path: str, data: bytes) -> None:
    with open(path, "ab") as fp:
        fp.write(data)


def test_whole_lines_only_and_each_with_its_prefix(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    relay, files = relay_of(tmp_path, out, err)
    append(files[1][0], b"first half ")
    append(files[0][0], b"rank zero line\n")
    relay.poll()
    append(files[1][0], b"second half\nno end")
    relay.poll()
    append(files[1][1], b"an error\n")
    relay.stop()
    assert out.getvalue() == "[0] rank zero line\n[1] first half second half\n[1] no end\n"
    assert err.getvalue() == "[1] an error\n"


def test_a_bar_in_a_file_is_its_first_state_one_line_per_interval_and_its_last(tmp_path):
    clock = FakeClock()
    out, err = io.StringIO(), io.StringIO()
    relay, files = relay_of(tmp_path, out, err, clock=clock)
    for step in range(0, 101, 5):  # 21 redraws, 1 s apart
        append(files[1][1], f"\rbar {step:3d}%".encode())
        relay.poll()
        clock.now += 1.0
    append(files[1][1], b"\n")
    relay.stop()
    assert err.getvalue().splitlines() == ["[1] bar   0%", "[1] bar  50%", "[1] bar 100%"]


def test_a_cleared_bar_in_a_file_keeps_its_last_state(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    relay, files = relay_of(tmp_path, out, err)
    append(files[1][1], b"\rbar 10%\rbar 20%\rbar 30%\r       \r")
    relay.poll()
    append(files[1][1], b"after\n")
    relay.stop()
    assert err.getvalue().splitlines() == ["[1] bar 10%", "[1] bar 30%", "[1] after"]


def test_rank_0_bar_is_one_live_line_on_a_terminal(tmp_path):
    console = TerminalStream()
    relay, files = relay_of(tmp_path, console, console)
    screen = Screen(80)
    for step in range(0, 101, 10):
        append(files[0][1], f"\rbar {step:3d}%".encode())
        relay.poll()
        screen.feed(console.getvalue())
        console.seek(0)
        console.truncate()
        assert screen.lines()[-1] == f"[0] bar {step:3d}%"
        if step == 50:
            append(files[1][0], b"line of rank 1\n")
    append(files[0][1], b"\n")
    relay.stop()
    screen.feed(console.getvalue())
    assert screen.lines() == ["[1] line of rank 1", "[0] bar 100%"]


def test_a_live_line_that_would_wrap_is_cut_to_the_terminal(tmp_path):
    console = TerminalStream()
    relay, files = relay_of(tmp_path, console, console)
    append(files[0][0], b"\r" + b"x" * 200)
    relay.poll()
    screen = Screen(80)
    screen.feed(console.getvalue())
    assert screen.lines() == ["[0] " + "x" * 75]
    relay.stop()


@pytest.mark.slow
def test_a_user_script_s_bar_is_live_under_a_terminal_and_other_ranks_stay_whole(tmp_path):
    run = PtyRun([sys.executable, "-m", "ringtrain", "run", "-np", "2", sys.executable, BARS, str(tmp_path)],
                 columns=100)
    try:
        # rank 0 waits at 50% until we have seen its bar drawn on the terminal's last line
        seen = run.wait_for(lambda s: s.cursor_line().startswith("[0] work:  50%|"))
        (tmp_path / "seen").touch()
        assert seen, run.raw[-2000:]
    finally:
        (tmp_path / "seen").touch()
        code = run.finish()
    assert code == 0, run.raw[-2000:]
    lines = run.screen.lines()
    # the bar left one row (tqdm's leave=True), not a row per refresh; rank 1's lines are whole
    bar_rows = [line for line in lines if "work:" in line]
    assert len(bar_rows) == 1, lines
    assert bar_rows[0].startswith("[0] work: 100%|")
    assert "40/40" in bar_rows[0]
    assert lines[-1] == bar_rows[0]
    assert [line for line in lines if line.startswith("[1]")] == [
        "[1] rank 1 line 0", "[1] rank 1 line 1", "[1] rank 1 line 2", "[1] part A part B"]
    assert all(len(line) <= 100 for line in lines)
    assert run.raw.count("\r[0] work:") >= 2  # drawn again and again on the same row


@pytest.mark.slow
def test_a_user_script_s_bar_through_a_pipe_is_a_few_whole_lines(tmp_path):
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "ringtrain", "run", "-np", "2", "--output-filename",
                           str(logs), sys.executable, BARS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    output = proc.stdout + proc.stderr
    assert "\r" not in output
    for line in output.splitlines():
        assert PREFIX.match(line), line  # every line starts with its rank
        assert not PREFIX.search(line, 1), line  # and no prefix lands inside a line
    assert "[1] part A part B" in proc.stdout
    bar_lines = [line for line in proc.stderr.splitlines() if "work:" in line]
    refreshes = (logs / "rank.0" / "stderr").read_bytes().count(b"\r")
    assert refreshes > 20
    assert len(bar_lines) <= refreshes // 4
    assert bar_lines[-1].startswith("[0] work: 100%|")


@pytest.mark.slow
def test_the_trainer_s_bar_is_live_under_a_terminal(tmp_path):
    run = PtyRun([sys.executable, "-m", "ringtrain", "train", "synthetic", "-np", "2", "--subset", "1024",
                  "--epochs", "2", "--batch-size", "16", "--threads", "1"], columns=120)
    code = run.finish()
    assert code == 0, run.raw[-3000:]
    lines = run.screen.lines()
    # the bar was drawn live (on one row, again and again) and cleared at the end of each epoch
    assert run.raw.count("\r[0] epoch 1/2:") >= 2
    assert not [line for line in lines if "epoch 1/2:" in line or "batches/s" in line], lines
    assert any(line.startswith("[0] epoch 2/2  time") for line in lines), lines
    done = [i for i, line in enumerate(lines) if line.startswith("[0] done: 2 epoch(s)")]
    assert done, lines
    # After the trainer's last line only the launcher's verdict on a slow rank may come (a loaded
    # machine makes one rank arrive last at most collectives), wrapped at the terminal's width.
    # (compared without spaces: a wrapped row loses the space it ended with)
    after = "".join(lines[done[-1] + 1:]).replace(" ", "")
    assert re.fullmatch(r"(ringtrainrun:.*?istheslowest:itarriveslastat\d+%of\d+collectives,"
                        r"\d+msaftertheothers\(median\))*", after), lines


def test_the_workers_learn_whether_the_console_is_live(monkeypatch):
    monkeypatch.delenv("TQDM_NCOLS", raising=False)
    assert ConsoleRelay(io.StringIO(), io.StringIO()).worker_variables() == {"RINGTRAIN_LIVE_CONSOLE": "0"}
    live = ConsoleRelay(TerminalStream(), TerminalStream()).worker_variables()
    assert live["RINGTRAIN_LIVE_CONSOLE"] == "1"
    assert int(live["TQDM_NCOLS"]) >= 20
