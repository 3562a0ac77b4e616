"""``ringtrain bench``: a real MNIST sweep offline, a user script, bad input, the validation mode."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.bench.outputs import CSV_COLUMNS
from ringtrain.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringtrain", "bench", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_mnist_sweep_writes_table_json_csv_and_plot(tmp_path):
    out = tmp_path / "mnist"
    # the fewest steps that still give every run a median and a tail of its step times
    result = _bench("mnist", "--np", "1,2", "--steps", "4", "--warmup-steps", "1", "--repeats", "1",
                    "--strategies", "single,independent,barrier,ddp,horovod,horovod-powersgd4,ddp-diloco2",
                    "--project", "--validate", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bench: estimate (not a measurement): about" in result.stderr
    table = result.stdout
    assert "processes  strategy" in table
    assert "PROJECTION" in table
    assert "MODEL VALIDATION" in table
    body = json.loads((out / "scaling.json").read_text())
    assert body["schema"] == "ringtrain.bench/1"
    assert body["settings"]["np"] == [1, 2]
    assert body["settings"]["steps"] == 4
    for key in ("cpu", "cores", "gpus", "torch", "ringtrain", "date"):
        assert key in body["machine"]
    assert body["link"]["alpha_s"] >= 0
    assert body["link"]["beta_bytes_per_s"] > 0
    assert len(body["link"]["samples"]) >= 2
    runs = {r["strategy"]: r for r in body["runs"]}
    competitors = {"ddp", "horovod", "horovod-powersgd4", "ddp-diloco2"}
    assert set(runs) == {"single", "independent", "barrier", *competitors}
    for run in runs.values():
        assert run["status"] == "ok"
        assert run["items_per_second"] > 0
        assert run["steps"] >= 4
        assert run["ranks_reported"] == run["np"]
        assert (out / run["log"]).exists()
    assert runs["single"]["reports"][0]["phases"]["backward"] > 0
    assert runs["single"]["reports"][0]["gradient_bytes"] > 0
    rows = {r["strategy"]: r for r in body["rows"]}
    assert rows["single"]["efficiency"] == 1.0
    assert rows["horovod"]["efficiency"] == pytest.approx(rows["horovod"]["speedup"] / 2)
    assert rows["horovod"]["model_efficiency"] is not None
    # independent copies list their step times: the ceiling of a synchronous job, below their own
    assert len(runs["independent"]["reports"][1]["step_seconds"]) == runs["independent"]["steps"]
    assert 0 < rows["independent"]["lockstep_efficiency"] <= rows["independent"]["efficiency"] + 1e-9
    assert "lockstep ceiling at 2 processes: efficiency" in table
    assert rows["horovod"]["lockstep_efficiency"] is None
    assert {e["strategy"] for e in body["validation"]} == competitors
    # the barrier ranks measured what lockstep costs: the model's compute slow-down comes from them
    assert {e["compute_factor_from"] for e in body["validation"]} == {"barrier"}
    assert "barrier at 2 processes: efficiency" in table
    # every built-in run lists its step times: each row gives their median and tail
    assert "p95 step" in table
    for row in rows.values():
        assert 0 < row["step_seconds_p50"] <= row["step_seconds_p95"]
    # data-parallel replicas end bit-identical; the barrier ranks' drift apart (no gradient exchange)
    digests = {s: [r["parameters_digest"] for r in run["reports"]] for s, run in runs.items()}
    assert digests["horovod"][0] == digests["horovod"][1]
    assert digests["ddp"][0] == digests["ddp"][1]
    assert digests["horovod-powersgd4"][0] == digests["horovod-powersgd4"][1]
    assert digests["ddp-diloco2"][0] == digests["ddp-diloco2"][1]  # averaged at the epoch's end
    # PowerSGD's uncompressed steps are not timed; Local SGD times whole averaging periods
    powersgd, diloco, fp32 = (runs[s]["reports"][0] for s in ("horovod-powersgd4", "ddp-diloco2", "horovod"))
    assert powersgd["warmup_steps"] == 12
    assert "warm-up: horovod-powersgd4 took 12 steps, not 1" in table
    assert runs["ddp-diloco2"]["steps"] % 2 == 0
    # what each method put on the wire, in the reports, the rows and the table's extra columns
    assert fp32["wire_bytes_per_step"] == fp32["gradient_bytes"]
    assert (powersgd["method"], diloco["method"]) == ("powersgd:4", "localsgd:2")
    assert powersgd["compression_ratio"] > 1
    assert diloco["wire_bytes_per_step"] == fp32["gradient_bytes"] / 2
    assert rows["ddp-diloco2"]["compression_ratio"] == 2.0
    assert "wire/step" in table
    assert {p["method"] for p in body["projection"]} == {"fp32", "powersgd:4", "localsgd:2"}
    assert "METHOD THAT PAYS" in table
    assert {e["interconnect"] for e in body["method_that_pays"]} >= {"25GbE", "measured"}
    assert digests["barrier"][0] != digests["barrier"][1]
    assert {p["interconnect"] for p in body["projection"]} >= {"25GbE", "100GbE", "IB-HDR200", "NVLink4"}
    with (out / "scaling.csv").open() as fp:
        csv_rows = list(csv.DictReader(fp))
    assert tuple(csv_rows[0]) == CSV_COLUMNS
    assert len(csv_rows) == 7
    ceiling = rows["independent"]["lockstep_efficiency"]
    assert float(csv_rows[1]["lockstep_efficiency"]) == pytest.approx(ceiling, rel=1e-5)
    assert (out / "scaling.png").read_bytes().startswith(PNG)


@pytest.mark.slow
def test_a_user_script_is_benchmarked_with_its_reports(tmp_path):
    out = tmp_path / "script"
    result = _bench("--np", "1,2", "--repeats", "1", "--no-link-probe", "--out", str(out), "--",
                    sys.executable, "examples/synthetic_benchmark.py", "--model", "mnist-cnn",
                    "--batch-size", "8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
                    "--num-iters", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads((out / "scaling.json").read_text())
    assert body["settings"]["command"][1] == "examples/synthetic_benchmark.py"
    runs = {r["np"]: r for r in body["runs"]}
    assert runs[1]["strategy"] == "single"
    assert runs[2]["strategy"] == "script"
    assert runs[1]["items"] == 32
    assert runs[2]["items"] == 64
    assert runs[2]["ranks_reported"] == 2
    # the script reports its parameters' digest: the sweep checked that its two workers agree
    digests = [r["parameters_digest"] for r in runs[2]["reports"]]
    assert len(digests) == 2
    assert digests[0] == digests[1]
    rows = {r["np"]: r for r in body["rows"]}
    assert rows[2]["speedup_from"] == "throughput"
    assert rows[2]["efficiency"] > 0
    assert (out / "scaling.png").exists()
    assert (out / "scaling.csv").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["mnist", "--np", "0,2"], "--np 0,2"),
    (["mnist", "--np", "1,x"], "--np 1,x: 'x'"),
    (["mnist", "--strategies", "single,dpp"], "'dpp' is not a strategy"),
    (["mnist", "--strategies", "horovod,horovod-powersgd0"], "'horovod-powersgd0': PowerSGD's rank must be"),
    (["mnist", "--strategies", "ddp-localsgd"], "'ddp-localsgd': -localsgd needs the steps between"),
    (["mnist", "--strategies", "foo"], "--strategies foo: 'foo' is not a strategy"),
    (["mnist", "--epochs", "1", "--steps", "5"], "--steps 5 and --epochs 1"),
    (["mnsit", "--np", "1,2"], "'mnsit' is neither a built-in workload"),
    (["mnist", "--np", "1,3", "--scaling", "strong", "--batch-size", "64"], "does not split evenly over 3"),
    (["mnist", "--np", "1,3", "-H", "a:1,b:1"], "3 processes do not fit the 2 slots"),
    (["mnist", "--arch", "vgg"], "--arch 'vgg'"),
    (["mnist", "--subset", "50", "--batch-size", "64", "--np", "1,2"],
     "needs 64 training items; mnist has 50"),
    (["mnist", "--interconnect", "fast"], "--interconnect 'fast'"),
    (["--np", "1,2", "--", "python", "no/such/train.py"], "script not found"),
    (["--np", "1,2", "--steps", "5", "--", "python", "-c", "pass"], "only apply to built-in workloads"),
    ([], "nothing to benchmark"),
])
def test_bad_input_exits_2_naming_the_value_and_the_fix(capsys, argv, message):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "HINT" in err
    assert "Traceback" not in err


def test_validate_reads_sweeps_and_reports_the_error(tmp_path, capsys):
    from ringtrain.bench.outputs import write_json
    from tests.bench.helpers import sample_body

    for name in ("a", "b"):
        write_json(sample_body(), tmp_path / name / "scaling.json")
    assert main(["bench", "--validate", str(tmp_path / "a"), str(tmp_path / "b"), "--out",
                 str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "MODEL VALIDATION" in out
    assert "mean absolute error" in out
    saved = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert len(saved["entries"]) == 4
    assert saved["max_absolute_error"] >= saved["mean_absolute_error"]


def test_validate_refuses_folders_without_sweeps(tmp_path, capsys):
    assert main(["bench", "--validate", str(tmp_path)]) == 2
    assert "HINT" in capsys.readouterr().err


def _settings_of(monkeypatch, *argv: str):
    """The settings ``ringtrain bench ARGV`` hands to the sweep (which does not run)."""
    import ringtrain.bench.sweep

    seen = []
    monkeypatch.setattr(ringtrain.bench.sweep, "run_bench",
                        lambda settings, progress: seen.append(settings) or 0)
    assert main(["bench", *argv]) == 0
    return seen[0]


def test_projection_and_validation_are_opt_in(monkeypatch):
    plain = _settings_of(monkeypatch, "mnist", "--np", "1,2")
    assert (plain.project, plain.validate, plain.probes_link) == (False, False, False)
    both = _settings_of(monkeypatch, "mnist", "--np", "1,2", "--project", "--validate")
    assert (both.project, both.validate, both.probes_link) == (True, True, True)
    alone = _settings_of(monkeypatch, "mnist", "--validate", "--np", "1,2")
    assert alone.validate
    assert not alone.project
    assert not _settings_of(monkeypatch, "mnist", "--project", "--no-link-probe").probes_link


def test_every_method_reaches_the_sweep_by_its_strategy_name(monkeypatch):
    settings = _settings_of(monkeypatch, "mnist", "--strategies",
                            "horovod,horovod-powersgd,ddp-powersgd8,horovod-localsgd8,horovod-diloco8")
    assert settings.strategies == ("horovod", "horovod-powersgd4", "ddp-powersgd8", "horovod-localsgd8",
                                   "horovod-diloco8")
    assert settings.steps_of("ddp-powersgd8") == (12, 50)
    assert settings.steps_of("horovod-diloco8") == (5, 56)


def test_help_lists_the_strategy_names(capsys):
    import re

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    # argparse wraps help text at hyphens and spaces: undo both before looking for a name
    text = re.sub(r"\s+", " ", re.sub(r"-\n\s+", "-", capsys.readouterr().out))
    for name in ("single, ddp, horovod, independent, barrier", "-fp16", "-bf16", "-powersgdR", "-localsgdH",
                 "-dilocoH", "horovod-powersgd4", "horovod-localsgd8"):
        assert name in text


def test_validate_given_a_workload_says_where_the_flag_goes(capsys):
    assert main(["bench", "--validate", "mnist"]) == 2
    err = capsys.readouterr().err
    assert "'mnist' is a workload, not a folder" in err
    assert "ringtrain bench mnist --validate" in err


@pytest.mark.slow
def test_a_horovod_script_gets_a_true_scaling_table(tmp_path):
    """The tutorial's table: the baseline runs with the shim, the reported epochs are timed, not start-up."""
    import os
    import stat

    out = tmp_path / "hvd"
    old = os.umask(0o022)
    try:
        result = _bench("--np", "1,2", "--repeats", "1", "--out", str(out), "--", "python",
                        "examples/horovod_mnist.py", "--epochs", "2", "--train-samples", "640",
                        "--data-dir", str(tmp_path / "no-data-here"))
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "estimated after the first run" in result.stderr
    body = json.loads((out / "scaling.json").read_text())
    runs = {r["np"]: r for r in body["runs"]}
    assert runs[1]["status"] == "ok"  # no ModuleNotFoundError: the shim was there
    for np, run in runs.items():
        assert run["ranks_reported"] == np
        assert run["epochs"] == 2
        assert run["items"] == 2 * 640  # both epochs of every rank, whatever the start-up
        assert run["steps"] == 20 // np  # 10 batches of 64 an epoch alone, 5 a rank on two ranks
        assert run["seconds"] < run["wall_seconds"]
    assert "using ringtrain's embedded subset" in (out / runs[1]["log"]).read_text()
    rows = {r["np"]: r for r in body["rows"]}
    assert rows[2]["speedup_from"] == "throughput"
    assert rows[2]["efficiency"] == pytest.approx(rows[2]["speedup"] / 2)
    assert "startup" not in body  # it reported: nothing to measure
    assert "timed: what the script reported (RINGTRAIN_BENCH lines: 2 epoch(s) per run)" in result.stdout
    assert "PROJECTION" not in result.stdout
    assert "MODEL VALIDATION" not in result.stdout
    assert body["link"] is None  # nobody asked for the model: no link probe either
    for name in ("scaling.json", "scaling.csv", "scaling.png"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644


@pytest.mark.slow
def test_a_silent_script_is_timed_by_wall_time_minus_its_start_up(tmp_path):
    script = tmp_path / "silent.py"
    # start-up: an import; "training": 3 s, longer than any start-up jitter. Slept, not spun: what is
    # checked is how the table is made from wall and start-up, and spinning cost 3 CPU s per process.
    script.write_text("import json\nimport time\n\ntime.sleep(3.0)\n")
    out = tmp_path / "silent"
    result = _bench("--np", "1,2", "--repeats", "1", "--out", str(out), "--", sys.executable, str(script))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the script reported nothing" in result.stderr
    body = json.loads((out / "scaling.json").read_text())
    assert set(body["startup"]["seconds"]) == {"1", "2"}
    assert {r["np"] for r in body["startup"]["runs"]} == {1, 2}
    rows = {r["np"]: r for r in body["rows"]}
    for np in (1, 2):
        assert rows[np]["net_wall_seconds"] == pytest.approx(rows[np]["wall_seconds"]
                                                             - rows[np]["startup_seconds"])
    assert rows[2]["speedup_from"] == "wall time minus start-up"
    assert "WALL TIME MINUS A MEASURED START-UP" in result.stdout
    assert "wall - start-up" in result.stdout


def _finished_sweep(folder: Path) -> Path:
    from ringtrain.bench.analysis import annotate
    from ringtrain.bench.outputs import write_json
    from tests.bench.helpers import sample_body

    body = sample_body()
    annotate(body)
    write_json(body, folder / "scaling.json")
    return folder


def test_replot_redraws_the_plot_and_reprints_the_table_without_running_anything(tmp_path, capsys,
                                                                                  monkeypatch):
    pytest.importorskip("matplotlib")
    import ringtrain.bench.sweep

    monkeypatch.setattr(ringtrain.bench.sweep, "run_sweep", lambda *a, **k: pytest.fail("a sweep ran"))
    folder = _finished_sweep(tmp_path)
    assert main(["bench", "--replot", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "processes  strategy" in out
    assert out.rstrip().endswith(f"wrote {folder / 'scaling.png'}")
    assert (folder / "scaling.png").read_bytes().startswith(PNG)
    assert sorted(p.name for p in folder.iterdir()) == ["scaling.json", "scaling.png"]


def test_replot_without_matplotlib_names_the_install_command(tmp_path, capsys, monkeypatch):
    from ringtrain.bench import plot

    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    assert main(["bench", "--replot", str(_finished_sweep(tmp_path))]) == 1
    captured = capsys.readouterr()
    assert "processes  strategy" in captured.out  # the table still comes
    assert ("ringtrain bench: scaling.png not written: matplotlib is not installed. HINT: pip install "
            "'ringtrain[plot]'") in captured.err
    assert not (tmp_path / "scaling.png").exists()


@pytest.mark.parametrize(("content", "message"), [
    (None, "no scaling.json in that folder"),
    ("{oops", "is not valid JSON"),
    ('{"schema": "ringtrain.bench/1", "rows": [{"strategy": "single", "np": 1, "status": "ok"}], '
     '"settings": {"workload": "mnist"}}', "cannot be drawn or tabulated"),
])
def test_replot_of_a_bad_folder_exits_2_with_one_line_naming_the_path_and_the_fix(tmp_path, capsys, content,
                                                                                  message):
    if content is not None:
        (tmp_path / "scaling.json").write_text(content)
    assert main(["bench", "--replot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert str(tmp_path) in err
    assert "HINT" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_replot_takes_no_workload(tmp_path, capsys):
    assert main(["bench", "mnist", "--replot", str(tmp_path)]) == 2
    assert "HINT: run ringtrain bench --replot" in capsys.readouterr().err


def test_a_folder_holding_an_earlier_sweep_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    import ringtrain.bench.sweep

    monkeypatch.setattr(ringtrain.bench.sweep, "run_sweep", lambda *a, **k: pytest.fail("a sweep ran"))
    folder = _finished_sweep(tmp_path)
    assert main(["bench", "mnist", "--np", "1,2", "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert f"--out {folder} holds an earlier sweep (scaling.json)" in err
    assert "--overwrite" in err
    assert len(err.strip().splitlines()) == 1
    assert (folder / "scaling.json").is_file()


def test_overwrite_reaches_the_sweep(monkeypatch):
    assert _settings_of(monkeypatch, "mnist", "--overwrite").overwrite
    assert not _settings_of(monkeypatch, "mnist").overwrite
