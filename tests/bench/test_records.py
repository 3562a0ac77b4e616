"""From rank reports to a run's throughput, and from runs to the table's rows."""

import pytest

from ringtrain.bench.records import Measurement, combine_reports, summarize
from tests.bench.helpers import measurement, report


def test_a_run_counts_all_ranks_over_the_slowest_one():
    m = Measurement(index=0, repeat=0, strategy="horovod", np=2)
    combine_reports(m, [report(0, 2, 640, 2.0, host="a"), report(1, 2, 640, 2.5, host="b")])
    assert m.items == 1280
    assert m.seconds == 2.5
    assert m.items_per_second == pytest.approx(512)
    assert m.steps == 10
    assert m.seconds_per_step == pytest.approx(0.25)
    assert m.hosts == ["a", "b"]
    assert m.ranks_reported == 2
    assert not m.extrapolated


def test_ranks_that_did_not_report_count_as_fast_as_the_others():
    m = Measurement(index=0, repeat=0, strategy="script", np=4)
    combine_reports(m, [report(0, 4, 100, 1.0)])
    assert m.extrapolated
    assert m.items == 400
    assert m.items_per_second == pytest.approx(400)


def test_a_repeated_rank_keeps_its_last_report_and_no_report_means_wall_time_only():
    m = Measurement(index=0, repeat=0, strategy="script", np=1)
    combine_reports(m, [report(0, 1, 1, 1.0), report(0, 1, 50, 1.0)])
    assert m.items == 50
    silent = Measurement(index=1, repeat=0, strategy="script", np=2, wall_seconds=3.0)
    combine_reports(silent, [])
    assert silent.items_per_second is None
    assert silent.ranks_reported == 0


def test_epoch_time_from_throughput():
    m = Measurement(index=0, repeat=0, strategy="single", np=1)
    combine_reports(m, [report(0, 1, 500, 1.0, items_per_epoch=10_000, steps_per_epoch=157)])
    assert m.seconds_per_epoch == pytest.approx(20.0)


def test_rows_give_speedup_efficiency_spread_and_failures():
    runs = [measurement(0, "single", 1, 0, 100.0), measurement(1, "horovod", 2, 0, 90.0),
            measurement(2, "ddp", 2, 0, 70.0), measurement(3, "single", 1, 1, 100.0),
            measurement(4, "horovod", 2, 1, 80.0), measurement(5, "ddp", 2, 1, 0, ok=False)]
    rows = {(r.strategy, r.np): r for r in summarize(runs)}
    assert list(rows) == [("single", 1), ("horovod", 2), ("ddp", 2)]
    hvd = rows[("horovod", 2)]
    assert hvd.items_per_second == pytest.approx(170)  # median of 180 and 160
    assert hvd.speedup == pytest.approx(1.7)
    assert hvd.efficiency == pytest.approx(0.85)
    assert hvd.spread == pytest.approx(20 / 170)
    assert (hvd.efficiency_min, hvd.efficiency_max) == (pytest.approx(0.8), pytest.approx(0.9))
    ddp = rows[("ddp", 2)]
    assert ddp.runs == 2
    assert ddp.failed == 1
    assert ddp.status == "1/2 failed"
    assert ddp.errors == ["ddp np=2 #2: boom (exit code 1)"]
    assert ddp.efficiency == pytest.approx(0.7)  # from the run that worked
    assert rows[("single", 1)].efficiency == 1.0


def test_without_throughput_speedup_comes_from_wall_time():
    base = Measurement(index=0, repeat=0, strategy="single", np=1, wall_seconds=10.0)
    two = Measurement(index=1, repeat=0, strategy="script", np=2, wall_seconds=6.0)
    rows = summarize([base, two])
    assert rows[1].speedup == pytest.approx(10 / 6)
    assert rows[1].speedup_from == "wall time"
    assert rows[1].efficiency == pytest.approx(10 / 12)


def test_a_failed_baseline_leaves_speedup_empty():
    rows = summarize([measurement(0, "single", 1, 0, 0, ok=False), measurement(1, "ddp", 2, 0, 50.0)])
    assert rows[0].status == "failed"
    assert rows[1].speedup is None
    assert rows[1].efficiency is None


def test_measurements_round_trip_through_dicts():
    m = measurement(0, "ddp", 2, 0, 10.0)
    assert Measurement.from_dict({**m.as_dict(), "unknown": 1}) == m
