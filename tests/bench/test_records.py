"""From rank reports to a run's throughput, and from runs to the table's rows."""

import pytest

from ringtrain.bench.records import Measurement, combine_reports, lockstep_rate, percentile, summarize
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


def _copies(*series: list[float]) -> list[dict]:
    """Reports of independent copies that each trained 10 items a step, with these step times."""
    return [report(r, len(series), 10 * len(steps), sum(steps), steps=len(steps), step_seconds=steps)
            for r, steps in enumerate(series)]


def test_independent_copies_give_the_lockstep_rate_each_step_waiting_for_its_slowest_copy():
    m = Measurement(index=0, repeat=0, strategy="independent", np=2)
    combine_reports(m, _copies([1.0, 2.0, 1.0], [2.0, 1.0, 1.0]))
    assert m.items_per_second == pytest.approx(60 / 4)  # each copy took 4 s on its own
    assert m.lockstep_items_per_second == pytest.approx(60 / 5)  # in lockstep: 2 + 2 + 1 s
    # Waits only at the steps every copy listed (copy 0 waits 1 s at the first); a copy without step
    # times gives no ceiling.
    assert lockstep_rate(_copies([1.0, 3.0], [2.0])) == pytest.approx(30 / 5)
    assert lockstep_rate([*_copies([1.0]), report(1, 2, 10, 1.0)]) is None
    assert lockstep_rate(_copies([1.0])) is None


def test_the_lockstep_ceiling_never_passes_the_copies_own_rate_despite_rounded_step_times():
    # The worker rounds step times to 10 us: here one copy is the slowest at every step, and its
    # listed steps sum to 3 us less than the time it measured (CI once saw a ceiling 1.6e-5 above).
    m = Measurement(index=0, repeat=0, strategy="independent", np=2)
    slow = [0.01001] * 12
    combine_reports(m, [report(0, 2, 120, sum(slow) + 3e-6, steps=12, step_seconds=slow),
                        report(1, 2, 120, 12 * 0.00833, steps=12, step_seconds=[0.00833] * 12)])
    assert m.lockstep_items_per_second <= m.items_per_second
    assert m.lockstep_items_per_second == pytest.approx(240 / (sum(slow) + 3e-6))


def test_the_lockstep_ceiling_is_for_independent_copies_and_becomes_the_rows_efficiency_bound():
    synchronous = Measurement(index=1, repeat=0, strategy="horovod", np=2)
    combine_reports(synchronous, _copies([1.0, 2.0], [2.0, 1.0]))
    assert synchronous.lockstep_items_per_second is None  # its ranks already wait for each other
    base = Measurement(index=0, repeat=0, strategy="single", np=1)
    combine_reports(base, _copies([1.0, 1.0]))  # 10 items/s
    copies = [Measurement(index=2 + i, repeat=i, strategy="independent", np=2) for i in range(3)]
    for m, slow in zip(copies, (2.0, 1.5, 3.0)):
        combine_reports(m, _copies([1.0, slow], [slow, 1.0]))
    rows = {r.strategy: r for r in summarize([base, synchronous, *copies])}
    # lockstep rates 40/4, 40/3 and 40/6 items/s: median 10, over 2 x 10
    assert rows["independent"].lockstep_efficiency == pytest.approx(0.5)
    assert rows["independent"].lockstep_efficiency <= rows["independent"].efficiency
    assert rows["horovod"].lockstep_efficiency is None


def _digested(strategy: str, digests: list[str]) -> Measurement:
    m = Measurement(index=0, repeat=0, strategy=strategy, np=len(digests))
    combine_reports(m, [report(r, len(digests), 320, 1.0, parameters_digest=d)
                        for r, d in enumerate(digests)])
    return m


def test_a_data_parallel_run_whose_replicas_differ_does_not_count():
    m = _digested("horovod", ["aa" * 16, "bb" * 16])
    assert m.status == "failed"
    assert "2 different sets of parameters" in m.error
    assert "aaaaaaaaaaaa" in m.error
    assert "bbbbbbbbbbbb" in m.error
    row = summarize([_digested("single", ["cc" * 16]), m])[1]
    assert row.status == "failed"
    assert row.efficiency is None


def test_agreeing_replicas_and_the_references_pass_the_replica_check():
    assert _digested("ddp-fp16", ["aa" * 16, "aa" * 16]).ok
    # the references train a copy each: their replicas drift apart by design
    assert _digested("barrier", ["aa" * 16, "bb" * 16]).ok
    assert _digested("independent", ["aa" * 16, "bb" * 16]).ok
    # a user script that reports no digest is not judged by it
    m = Measurement(index=0, repeat=0, strategy="script", np=2)
    combine_reports(m, [report(0, 2, 320, 1.0), report(1, 2, 320, 1.0)])
    assert m.ok


def test_a_failed_run_keeps_its_own_error_over_the_replica_check():
    m = Measurement(index=0, repeat=0, strategy="horovod", np=2, status="failed", error="exit code 1")
    combine_reports(m, [report(0, 2, 320, 1.0, parameters_digest="aa"), report(1, 2, 320, 1.0,
                                                                               parameters_digest="bb")])
    assert m.error == "exit code 1"


def test_percentiles_interpolate_between_the_closest_ranks():
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 100) == 5.0


def test_rows_give_the_median_and_tail_of_every_ranks_step_times_over_good_repeats():
    def run(index: int, repeat: int, times: list[list[float]], ok: bool = True) -> Measurement:
        m = Measurement(index=index, repeat=repeat, strategy="horovod", np=2)
        combine_reports(m, [report(r, 2, 320, 1.0, step_seconds=t) for r, t in enumerate(times)])
        if not ok:
            m.status, m.error = "failed", "boom"
        return m

    runs = [run(0, 0, [[1.0, 1.0], [1.0, 3.0]]), run(1, 1, [[1.0, 1.0], [1.0, 1.0]]),
            run(2, 2, [[9.0, 9.0], [9.0, 9.0]], ok=False)]  # a failed repeat's steps do not count
    (row,) = summarize(runs)
    assert row.step_seconds_p50 == 1.0
    assert row.step_seconds_p95 == pytest.approx(percentile([1.0] * 7 + [3.0], 95))
    (plain,) = summarize([measurement(0, "ddp", 2, 0, 80.0)])  # no step times: no percentiles
    assert plain.step_seconds_p50 is None
    assert plain.step_seconds_p95 is None


def test_epoch_lines_of_a_rank_are_added_up():
    m = Measurement(index=0, repeat=0, strategy="script", np=2)
    lines = [{"items": 500, "seconds": 2.0, "steps": 8, "epoch": 1, "rank": 0, "world_size": 2},
             {"items": 500, "seconds": 1.0, "steps": 8, "epoch": 2, "rank": 0, "world_size": 2,
              "parameters_digest": "ab"},
             {"items": 500, "seconds": 2.5, "steps": 8, "epoch": 1, "rank": 1, "world_size": 2},
             {"items": 500, "seconds": 1.5, "steps": 8, "epoch": 2, "rank": 1, "world_size": 2,
              "parameters_digest": "ab"}]
    combine_reports(m, lines)
    assert m.ranks_reported == 2
    assert [r["epochs"] for r in m.reports] == [2, 2]
    assert m.reports[1]["epoch_seconds"] == [2.5, 1.5]
    assert m.items == 2000
    assert m.seconds == 4.0  # the slowest rank's two epochs
    assert m.steps == 16
    assert m.epochs == 2
    assert m.seconds_per_epoch == pytest.approx(2.0)
    assert m.reports[0]["parameters_digest"] == "ab"
    # a whole-run line with epochs=E gives the time per epoch too
    whole = Measurement(index=1, repeat=0, strategy="single", np=1)
    combine_reports(whole, [{"items": 1000, "seconds": 3.0, "epochs": 2, "rank": 0, "world_size": 1}])
    assert whole.seconds_per_epoch == pytest.approx(1.5)


def test_ranks_or_repeats_that_disagree_make_a_row_unsteady():
    m = Measurement(index=0, repeat=0, strategy="horovod", np=2)
    combine_reports(m, [report(0, 2, 100, 1.0), report(1, 2, 100, 1.3)])
    assert m.rank_spread == pytest.approx((100 - 100 / 1.3) / ((100 + 100 / 1.3) / 2))
    steady = [measurement(0, "single", 1, 0, 100.0), measurement(1, "single", 1, 1, 110.0)]
    assert not summarize(steady)[0].unsteady
    shaky = [measurement(0, "single", 1, 0, 100.0), measurement(1, "single", 1, 1, 130.0)]
    (row,) = summarize(shaky)
    assert row.spread == pytest.approx(0.30 / 1.15)
    assert row.unsteady
    assert row.as_dict()["unsteady"] is True
    (ranks,) = summarize([m])
    assert ranks.spread is None  # one repeat: nothing to compare (n/a), its ranks still disagree
    assert ranks.unsteady


def test_a_silent_script_is_compared_by_wall_time_minus_its_start_up():
    base = Measurement(index=0, repeat=0, strategy="single", np=1, wall_seconds=14.0)
    two = Measurement(index=1, repeat=0, strategy="script", np=2, wall_seconds=11.0)
    rows = summarize([base, two], startup={1: 4.0, 2: 6.0})
    assert rows[0].net_wall_seconds == 10.0
    assert rows[1].net_wall_seconds == 5.0
    assert rows[1].startup_seconds == 6.0
    assert rows[1].speedup == pytest.approx(2.0)  # raw wall time would say 14 / 11
    assert rows[1].speedup_from == "wall time minus start-up"
    # a start-up as long as the run says nothing: raw wall time, labelled so
    rows = summarize([base, two], startup={1: 4.0, 2: 12.0})
    assert rows[1].speedup_from == "wall time"
    assert rows[1].speedup == pytest.approx(14 / 11)


def test_a_row_records_its_shortest_timed_part_and_whether_it_is_too_short_to_trust():
    from ringtrain.bench.records import SHORT_RUN_S

    def timed(index: int, seconds: float, ok: bool = True) -> Measurement:
        m = Measurement(index=index, repeat=index, strategy="single", np=1, wall_seconds=9.0)
        combine_reports(m, [report(0, 1, 100 * seconds, seconds)])
        if not ok:
            m.status = "failed"
        return m

    (row,) = summarize([timed(0, 3.0), timed(1, 1.5), timed(2, 0.1, ok=False)])  # a failed run: not counted
    assert row.timed_seconds == 1.5
    assert row.too_short
    assert row.as_dict()["too_short"] is True
    (row,) = summarize([timed(0, SHORT_RUN_S), timed(1, 3.0)])
    assert not row.too_short
    assert row.as_dict()["timed_seconds"] == SHORT_RUN_S
    # a silent script: its timed part is the wall time it is compared by, start-up left out when measured
    base = Measurement(index=0, repeat=0, strategy="single", np=1, wall_seconds=5.0)
    assert summarize([base])[0].timed_seconds == 5.0
    (net,) = summarize([base], startup={1: 4.0})
    assert net.timed_seconds == pytest.approx(1.0)
    assert net.too_short
    assert summarize([timed(0, 0.1, ok=False)])[0].timed_seconds is None  # nothing ran: nothing to say


def test_a_row_carries_its_methods_bytes_and_the_steps_its_runs_took():
    from tests.bench.helpers import method_sweep

    rows = {r["strategy"]: r for r in method_sweep()["rows"]}
    powersgd = rows["horovod-powersgd4"]
    assert (powersgd["method"], powersgd["wire_bytes_per_step"], powersgd["warmup_steps"]) == (
        "powersgd:4", 26_880, 12)
    assert rows["horovod-localsgd8"]["compression_ratio"] == 8.0
    assert rows["horovod"]["steps"] == 10
    base = rows["single"]
    assert (base["method"], base["wire_bytes_per_step"], base["compression_ratio"], base["warmup_steps"]) == (
        None, None, None, 5)
