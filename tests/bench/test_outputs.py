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
