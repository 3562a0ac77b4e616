"""Real sweeps of a small script through the real launcher: failures, hangs, partial reports."""

import csv
import json
import sys
from pathlib import Path

import pytest

from ringtrain.bench.plan import BenchSettings
from ringtrain.bench.sweep import run_bench, run_sweep

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "report_items.py")

pytestmark = pytest.mark.slow


def _settings(tmp_path: Path, *args: str, nps=(1, 2), **kwargs) -> BenchSettings:
    return BenchSettings(command=(sys.executable, SCRIPT, *args), nps=nps, repeats=1, out=tmp_path / "out",
                         link_probe=False, **kwargs)


def test_a_size_that_fails_keeps_the_other_rows(tmp_path, capsys):
    code = run_bench(_settings(tmp_path, "--fail-at", "2", nps=(1, 2, 3)), progress=False)
    assert code == 1
    captured = capsys.readouterr()
    assert "1 of 3 run(s) failed" in captured.err
    assert "np=2 script #1: report_items: error: this script refuses 2 processes" in captured.err
    assert "FAILED script np=2 #1" in captured.out
    assert "refuses 2 processes" in captured.out
    out = tmp_path / "out"
    rows = {r["processes"]: r for r in csv.DictReader((out / "scaling.csv").open())}
    assert rows["1"]["status"] == "ok"
    assert rows["3"]["status"] == "ok"
    assert rows["2"]["status"] == "failed"
    assert rows["2"]["items_per_second"] == ""
    assert float(rows["3"]["items_per_second"]) > 0
    body = json.loads((out / "scaling.json").read_text())
    failed = next(r for r in body["runs"] if r["np"] == 2)
    assert failed["status"] == "failed"
    assert failed["exit_code"] != 0
    assert "refuses 2 processes" in (out / failed["log"]).read_text()


def test_a_run_that_hangs_is_stopped_and_marked(tmp_path):
    body = run_sweep(_settings(tmp_path, "--hang-at", "2", timeout_s=5.0), progress=False)
    hung = next(r for r in body["runs"] if r["np"] == 2)
    assert hung["status"] == "failed"
    assert "no exit after 5 s" in hung["error"]
    assert next(r for r in body["runs"] if r["np"] == 1)["status"] == "ok"


def test_reports_from_rank_0_only_stand_for_every_rank_and_progress_lines_without_a_terminal(tmp_path,
                                                                                              capsys):
    body = run_sweep(_settings(tmp_path, "--rank0-only", "--items", "300"), progress=False)
    two = next(r for r in body["runs"] if r["np"] == 2)
    assert two["status"] == "ok"
    assert two["ranks_reported"] == 1
    assert two["extrapolated"]
    assert two["items"] == 600
    capsys.readouterr()
    # the sweep of every rank's reports also shows the progress lines (one sweep fewer than a test each)
    every = run_sweep(_settings(tmp_path, "--items", "300"), progress=True)
    out = capsys.readouterr().out
    assert "[1/2] np=1 single #1:" in out
    assert "[2/2] np=2 script #1:" in out
    two = next(r for r in every["runs"] if r["np"] == 2)
    assert two["ranks_reported"] == 2
    assert not two["extrapolated"]
    assert two["items"] == 600
    assert sorted(r["rank"] for r in two["reports"]) == [0, 1]


def test_a_built_in_workload_timed_by_epochs(tmp_path):
    settings = BenchSettings(workload="mnist", epochs=1, subset=512, nps=(1, 2), strategies=("horovod",),
                             repeats=1, warmup_steps=1, threads=1, out=tmp_path / "out", link_probe=False)
    body = run_sweep(settings, progress=False)
    runs = {r["strategy"]: r for r in body["runs"]}
    assert runs["single"]["status"] == "ok"
    assert runs["horovod"]["status"] == "ok"
    # one epoch of 512 items: 8 batches of 64 alone, 4 per rank on 2 ranks; the first is warm-up
    assert runs["single"]["steps"] == 7
    assert runs["horovod"]["steps"] == 3
    assert runs["horovod"]["items"] == 3 * 64 * 2
    for run in runs.values():
        assert run["seconds_per_epoch"] == pytest.approx(512 / run["items_per_second"])
        # the baseline and the ranks ran with the same malloc (the default, tuned where glibc allows)
        assert {report["malloc"] for report in run["reports"]} == {runs["single"]["reports"][0]["malloc"]}
        assert run["reports"][0]["malloc"].startswith(("tuned", "system ("))
