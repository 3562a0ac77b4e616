"""Progress lines where no terminal watches (pipes, log files of schedulers)."""

from __future__ import annotations

from ringtrain.train.progress import Progress


class FakeClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_line_every_interval_with_rate_and_numbers(capsys):
    # stdout is captured (not a terminal): lines, not a bar; the clock moves 4 s per call.
    bar = Progress(True, total=10, description="epoch 2/3", initial=2, interval_s=10.0, clock=FakeClock(4.0))
    for _ in range(7):
        bar.update(1, loss=0.25)
    bar.close()
    bar.update(1, loss=0.1)  # closed: silent
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "epoch 2/3: 5/10 batches (50%), 0.2 batches/s, loss 0.2500",
        "epoch 2/3: 8/10 batches (80%), 0.2 batches/s, loss 0.2500",
    ]


def test_no_line_for_the_last_batch_nor_when_disabled(capsys):
    bar = Progress(True, total=3, description="epoch 1/1", interval_s=1.0, clock=FakeClock(5.0))
    bar.update(3)
    Progress(False, total=3, description="x", interval_s=0.0).update(3)
    assert capsys.readouterr().out == ""


def test_a_bar_when_the_launcher_draws_it_on_a_terminal(capsys, monkeypatch):
    # stdout is a file under `ringtrain run`; the launcher says its console draws rank 0's bar live
    monkeypatch.setenv("RINGTRAIN_LIVE_CONSOLE", "1")
    bar = Progress(True, total=4, description="epoch 1/1", interval_s=0.0, clock=FakeClock(1.0))
    for _ in range(4):
        bar.update(1, loss=0.5)
    bar.close()
    out = capsys.readouterr().out
    assert "\r" in out
    assert "epoch 1/1:" in out
    assert "\n" not in out  # redrawn in place, then cleared (leave=False): no line left behind
