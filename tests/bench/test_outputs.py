"""The terminal table, scaling.csv and scaling.json: their columns, fields and atomic writing."""

import csv
import io
import json
import math

import pytest

from ringtrain.bench.analysis import annotate
from ringtrain.bench.outputs import (
    CSV_COLUMNS,
    barrier_lines,
    csv_text,
    projection_text,
    table_text,
    validation_text,
    write_atomic,
    write_json,
)
from tests.bench.helpers import sample_body


def test_csv_has_the_documented_columns_and_one_row_per_configuration():
    body = sample_body()
    annotate(body)
    rows = list(csv.DictReader(io.StringIO(csv_text(body))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [(r["strategy"], r["processes"]) for r in rows] == [("single", "1"), ("ddp", "2"),
                                                              ("horovod-fp16", "2")]
    ddp = rows[1]
    assert ddp["workload"] == "mnist"
    assert ddp["scaling"] == "weak"
    assert (ddp["runs"], ddp["failed"], ddp["status"]) == ("2", "1", "1/2 failed")
    assert float(ddp["efficiency"]) == pytest.approx(0.8)
    assert float(ddp["speedup"]) == pytest.approx(1.6)
    assert float(ddp["model_efficiency"]) > 0
    assert rows[0]["model_efficiency"] == ""  # nothing to predict for the baseline


def test_json_holds_raw_runs_and_no_nan(tmp_path):
    body = sample_body()
    annotate(body)
    body["runs"][0]["seconds"] = math.nan
    write_json(body, tmp_path / "scaling.json")
    loaded = json.loads((tmp_path / "scaling.json").read_text())
    assert loaded["runs"][0]["seconds"] is None
    for key in ("schema", "settings", "machine", "link", "runs", "rows", "model", "validation", "projection"):
        assert key in loaded
    run = loaded["runs"][1]
    for key in ("strategy", "np", "repeat", "status", "wall_seconds", "items_per_second", "reports"):
        assert key in run
    assert run["reports"][0]["rank"] == 0


def test_atomic_write_leaves_only_the_file(tmp_path):
    write_atomic(tmp_path / "a.csv", "x\n")
    write_atomic(tmp_path / "a.csv", b"y\n")
    assert [p.name for p in tmp_path.iterdir()] == ["a.csv"]
    assert (tmp_path / "a.csv").read_text() == "y\n"


def test_table_shows_every_column_and_names_failures():
    body = sample_body()
    annotate(body)
    text = table_text(body)
    header = next(line for line in text.splitlines() if line.startswith("processes"))
    for column in ("strategy", "time/step", "items/s", "speedup", "efficiency", "spread", "model", "status"):
        assert column in header
    assert "FAILED ddp np=2 #2: boom (exit code 1)" in text
    assert "link (loopback): 800 Mbit/s, 100 us latency" in text
    assert "machine: Test CPU, 2 cores" in text


def test_projection_is_labelled_as_a_model():
    body = sample_body()
    annotate(body)
    text = projection_text(body)
    assert text.startswith("PROJECTION")
    assert "NOT a measurement" in text
    assert "fp32 gradients:" in text
    assert "fp16 gradients:" in text
    assert all(f" {p}" in text for p in (8, 1024))


def test_validation_text_reports_the_error():
    body = sample_body()
    annotate(body)
    text = validation_text([{**e, "workload": "mnist"} for e in body["validation"]])
    assert "mean absolute error" in text
    assert "horovod-fp16" in text
    assert validation_text([]) == ""


def test_the_barrier_line_says_what_lockstep_costs_and_how_close_each_competitor_comes():
    rows = [{"strategy": "single", "np": 1, "efficiency": 1.0},
            {"strategy": "independent", "np": 2, "efficiency": 0.95},
            {"strategy": "barrier", "np": 2, "efficiency": 0.9},
            {"strategy": "horovod", "np": 2, "efficiency": 0.81},
            {"strategy": "ddp", "np": 2, "efficiency": None},
            {"strategy": "barrier", "np": 4, "efficiency": 0.8}]
    first, second = barrier_lines(rows)
    assert first.startswith("barrier at 2 processes: efficiency 0.90")
    assert first.endswith("horovod reaches 0.90 of it")
    assert "independent" not in first
    assert "ddp" not in first
    assert second.startswith("barrier at 4 processes: efficiency 0.80")
    assert "reaches" not in second


def test_the_tail_column_appears_with_step_times_and_stays_right_aligned():
    body = sample_body()
    assert "p95 step" not in table_text(body)  # hand-made runs list no step times
    body["rows"][1].update(step_seconds_p50=0.08, step_seconds_p95=0.125)
    text = table_text(body)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("processes"))
    assert "p95 step" in header
    ddp = next(line for line in lines if line.split()[1:2] == ["ddp"])
    # the cell ends where its header does (numbers align right)
    assert ddp.index("125.0 ms") + len("125.0 ms") == header.index("p95 step") + len("p95 step")
    assert "p95 step: 95th percentile of every rank's step times" in text
    rows = list(csv.DictReader(io.StringIO(csv_text(body))))
    assert float(rows[1]["step_seconds_p95"]) == 0.125
    assert float(rows[1]["step_seconds_p50"]) == 0.08


def test_written_files_follow_the_umask(tmp_path):
    import os

    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "scaling.csv", "a\n")
        write_json({"a": 1}, tmp_path / "scaling.json")
    finally:
        os.umask(old)
    for name in ("scaling.csv", "scaling.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o640


def _script_body(**startup):
    from ringtrain.bench.records import Measurement, summarize

    runs = [Measurement(index=0, repeat=0, strategy="single", np=1, wall_seconds=14.0),
            Measurement(index=1, repeat=0, strategy="script", np=2, wall_seconds=11.0)]
    body = sample_body(link=False)
    body["settings"].update(workload=None, command=["python", "train.py"])
    body["runs"] = [m.as_dict() for m in runs]
    seconds = {int(k): v for k, v in startup.get("seconds", {}).items()}
    body["rows"] = [r.as_dict() for r in summarize(runs, seconds)]
    body["startup"] = startup
    return body


def test_a_silent_scripts_table_says_start_up_was_taken_out():
    table = table_text(_script_body(seconds={"1": 4.0, "2": 6.0}))
    assert "wall - start-up" in table.splitlines()[3]
    assert "WALL TIME MINUS A MEASURED START-UP (4.00 s at 1 process(es), 6.00 s at 2 process(es)" in table
    assert "2.00x (net wall)" in table
    unmeasured = table_text(_script_body(error="the command is not `python SCRIPT`"))
    assert "start-up was not measured (the command is not `python SCRIPT`)" in unmeasured
    assert "WALL TIME, start-up included" in unmeasured


def test_a_reporting_scripts_table_says_what_it_timed():
    body = sample_body(link=False)
    body["settings"].update(workload=None, command=["python", "train.py"])
    for run in body["runs"]:
        run["epochs"] = 2
    assert "timed: what the script reported (RINGTRAIN_BENCH lines: 2 epoch(s) per run), start-up left " \
           "out" in table_text(body)


def test_an_unsteady_row_is_flagged_and_warned_about():
    from ringtrain.bench.records import summarize
    from tests.bench.helpers import body, measurement

    shaky = body([measurement(0, "single", 1, 0, 100.0), measurement(1, "single", 1, 1, 130.0),
                  measurement(2, "ddp", 2, 0, 80.0), measurement(3, "ddp", 2, 1, 82.0)])
    assert [r.unsteady for r in summarize([])] == []
    table = table_text(shaky)
    assert "26.1% !" in table
    assert ("WARNING: 1 process(es) single: its repeats differ by 26% (above 20%): the machine was not steady"
            in table)
    assert "WARNING: 2 process(es) ddp" not in table
    assert "yes" in csv_text(shaky).splitlines()[1].split(",")


def test_one_repeat_has_no_spread_n_a_in_the_table_and_null_in_json(tmp_path):
    from tests.bench.helpers import body, measurement

    once = body([measurement(0, "single", 1, 0, 100.0), measurement(1, "ddp", 2, 0, 80.0),
                 measurement(2, "horovod-fp16", 2, 0, 0, ok=False)])
    rows = {r["strategy"]: r for r in once["rows"]}
    assert rows["single"]["spread"] is None
    write_json(once, tmp_path / "scaling.json")
    assert all(r["spread"] is None for r in json.loads((tmp_path / "scaling.json").read_text())["rows"])
    lines = table_text(once).splitlines()
    single = next(line for line in lines if " single " in line)
    assert "n/a" in single
    assert "0.0%" not in single
    assert "n/a" not in next(line for line in lines if "horovod-fp16" in line)  # failed: nothing at all
    assert "n/a: one repeat, nothing to compare (--repeats 3)" in table_text(once)
    # two repeats: a spread, and no n/a footnote
    twice = body([measurement(0, "single", 1, 0, 100.0), measurement(1, "single", 1, 1, 100.0)])
    assert "0.0%" in table_text(twice)
    assert "n/a" not in table_text(twice)


def _short_body(seconds: float, **settings):
    from tests.bench.helpers import body, measurement

    short = body([measurement(0, "single", 1, 0, 100.0), measurement(1, "ddp", 2, 0, 80.0)])
    for row in short["rows"]:
        row["timed_seconds"], row["too_short"] = seconds * row["np"], seconds * row["np"] < 2.0
    short["settings"].update(settings)
    return short


def test_a_short_timed_part_gets_one_warning_naming_sizes_seconds_threshold_and_the_fix():
    from ringtrain.bench.outputs import short_run_warnings

    (line,) = short_run_warnings(_short_body(0.5, steps=50, repeats=1))
    assert line.startswith("WARNING: timed part too short to trust (under 2 s in a run): "
                           "1 process(es) single 0.50 s, 2 process(es) ddp 1.00 s.")
    assert "raise --steps to 200 or more and keep --repeats 3 or more, then rerun" in line
    assert line in table_text(_short_body(0.5, steps=50, repeats=1))
    # only the short rows are named; with --repeats 3 already there, it is not asked for again
    (line,) = short_run_warnings(_short_body(1.2, steps=50, repeats=3))
    assert "ddp" not in line
    assert "1 process(es) single 1.20 s" in line
    assert "raise --steps to 90 or more, then rerun" in line
    assert short_run_warnings(_short_body(2.0)) == []
    assert "too short" not in table_text(_short_body(2.0))


def test_the_short_run_fix_names_the_flag_that_gives_more_work():
    from ringtrain.bench.outputs import short_run_warnings

    (line,) = short_run_warnings(_short_body(0.5, steps=None, epochs=1, repeats=3))
    assert "raise --epochs to 4 or more" in line
    # the first-hour command: the script's own --epochs, raised
    hvd = {"workload": None, "steps": None, "repeats": 3,
           "command": ["python", "examples/horovod_mnist.py", "--epochs", "1"]}
    (line,) = short_run_warnings(_short_body(0.6, **hvd))
    assert "give the script --epochs 4 or more (after --; it has 1)" in line
    (line,) = short_run_warnings(_short_body(0.6, **{**hvd, "command": ["python", "train.py"]}))
    assert "give the script about 4x as much to train (more epochs or steps, after --)" in line


def test_csv_and_json_record_the_timed_part_and_a_short_row(tmp_path):
    short = _short_body(0.5)
    rows = list(csv.DictReader(io.StringIO(csv_text(short))))
    assert [(r["timed_seconds"], r["too_short"]) for r in rows] == [("0.5", "yes"), ("1", "yes")]
    from tests.bench.helpers import sample_body

    write_json(sample_body(), tmp_path / "scaling.json")
    saved = json.loads((tmp_path / "scaling.json").read_text())["rows"][0]
    assert (saved["timed_seconds"], saved["too_short"]) == (1.0, True)


def _row_of(text: str, strategy: str) -> list[str]:
    return next(line.split() for line in text.splitlines() if line.split()[1:2] == [strategy])


def test_a_sweep_of_fp32_and_fp16_keeps_its_table_without_wire_columns():
    body = sample_body()  # ddp and horovod-fp16
    annotate(body)
    header = next(line for line in table_text(body).splitlines() if line.startswith("processes"))
    assert "wire/step" not in header
    assert "vs fp32" not in header


def test_powersgd_and_local_sgd_get_the_bytes_on_the_wire_and_their_ratio():
    from tests.bench.helpers import method_sweep

    body = method_sweep()
    annotate(body)
    text = table_text(body)
    header = next(line for line in text.splitlines() if line.startswith("processes"))
    assert header.split()[-5:] == ["wire/step", "vs", "fp32", "model", "status"]
    # fp32: 1,115,392 bytes; PowerSGD rank 4: 26,880 (41.5x fewer); Local SGD every 8: one eighth
    assert _row_of(text, "horovod")[8:11] == ["1.12", "MB", "1.0x"]
    assert _row_of(text, "horovod-powersgd4")[8:11] == ["26.9", "kB", "41.5x"]
    assert _row_of(text, "horovod-localsgd8")[8:11] == ["139", "kB", "8.0x"]
    assert _row_of(text, "single")[8:10] == ["-", "-"]  # one process sends nothing
    assert "vs fp32: how many times fewer than fp32 gradients" in text
    assert ("warm-up: horovod-powersgd4 took 12 steps, not 5: PowerSGD sends its first 10 steps "
            "uncompressed") in text
    assert "timed steps: horovod-localsgd8 timed 16, not 10: whole averaging periods of 8 steps" in text
    rows = {r["strategy"]: r for r in csv.DictReader(io.StringIO(csv_text(body)))}
    assert tuple(next(iter(rows.values()))) == CSV_COLUMNS
    assert (rows["horovod-powersgd4"]["method"], rows["horovod-powersgd4"]["wire_bytes_per_step"],
            rows["horovod-powersgd4"]["warmup_steps"]) == ("powersgd:4", "26880", "12")
    assert float(rows["horovod-localsgd8"]["compression_ratio"]) == 8.0
    assert (rows["single"]["method"], rows["single"]["compression_ratio"]) == ("", "")
    saved = {r["strategy"]: r for r in body["rows"]}
    assert saved["horovod-powersgd4"]["compression_ratio"] == pytest.approx(1_115_392 / 26_880)


def test_the_projection_has_a_table_per_method_and_says_which_pays():
    from tests.bench.helpers import method_sweep

    body = method_sweep()
    annotate(body)
    text = projection_text(body)
    assert "fp32 gradients:" in text
    assert "powersgd:4 (PowerSGD, rank-4 factors, 41.5x fewer bytes than fp32, 2 allreduce rounds" in text
    assert "localsgd:8 (Local SGD / DiLoCo: fp32 parameter deltas averaged every 8 steps" in text
    pays = text[text.index("METHOD THAT PAYS"):].splitlines()
    assert ("of fp32, powersgd:4, localsgd:8, the one with the shortest step, where it beats fp32 by 5%"
            in pays[0])
    assert [line.split()[0] for line in pays[1:6]] == ["25GbE:", "100GbE:", "IB-HDR200:", "NVLink4:",
                                                        "measured:"]
    measured = body["method_that_pays"][-1]["points"]
    assert all(p["pays"] in ("fp32", "localsgd:8") for p in measured)
    # the spans of the line are those of the points, from 8 to 1,024 ranks
    assert pays[5].split(":", 1)[1].strip().startswith("fp32 at 8-")
    assert "localsgd:8 at " in pays[5]
    assert pays[5].endswith("x fp32's speed)")
    assert pays[-1].startswith("step time only")


def test_the_pays_line_turns_points_into_ranges_of_ranks():
    from ringtrain.bench.outputs import pays_text

    def point(ranks, pays):
        return {"ranks": ranks, "fastest": pays, "pays": pays, "step_s": {"fp32": 0.2, "fp16": 0.15,
                                                                           "powersgd:4": 0.1}}

    body = {"method_that_pays": [{"interconnect": "25GbE", "points": [
        point(8, "fp32"), point(16, "fp32"), point(32, "fp16"), point(64, "powersgd:4"),
        point(128, "powersgd:4"), point(1024, "powersgd:4")]}]}
    _, line, _ = pays_text(body)
    assert line == ("  25GbE:  fp32 at 8-16, fp16 at 32, powersgd:4 at 64-1,024 ranks (1,024 ranks: 2.0x "
                    "fp32's speed)")
    assert pays_text({}) == []


def test_projection_entries_of_an_earlier_sweep_still_print():
    body = sample_body()
    annotate(body)
    for entry in body["projection"]:  # as written before the other methods: fp16 only
        del entry["method"]
    body["method_that_pays"] = []
    text = projection_text(body)
    assert "fp32 gradients:" in text
    assert "fp16 gradients:" in text
    assert "METHOD THAT PAYS" not in text
