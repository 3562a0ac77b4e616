"""The model on a sweep's own numbers: inputs from the baseline, a prediction per measured row."""

from pathlib import Path

import pytest

from ringtrain.bench.analysis import annotate, link_applies, oversubscription, step_model
from ringtrain.bench.model import FP32, StepModel, predict
from ringtrain.bench.records import Measurement
from ringtrain.exchange import Method, local_sgd
from tests.bench.helpers import SHAPES, measurement, method_sweep, report, sample_body

ROOT = Path(__file__).resolve().parents[2]


def test_inputs_come_from_the_baseline():
    runs = [measurement(0, "single", 1, 0, 100.0), measurement(1, "single", 1, 1, 100.0)]
    model = step_model(runs, FP32, strong=False)
    assert model.compute_s == pytest.approx(0.1)  # 10 steps in 1 s
    assert model.backward_s == pytest.approx(0.1 * 0.6)  # backward share of the timed phases
    assert model.gradient_bytes == 1_572_864
    assert step_model([measurement(0, "ddp", 2, 0, 1.0)], FP32, strong=False) is None


def test_oversubscription_counts_ranks_per_host():
    m = Measurement(index=0, repeat=0, strategy="horovod", np=4)
    m.reports = [report(r, 4, 1, 1.0, host="a") for r in range(4)]
    m.ranks_reported = 4
    assert oversubscription(m) == 2.0  # 4 ranks x 1 thread on 2 cores
    m.reports = [report(r, 4, 1, 1.0, host="ab"[r % 2]) for r in range(4)]
    assert oversubscription(m) == 1.0


def test_namespace_hosts_on_one_kernel_are_one_machine():
    from ringtrain.bench.analysis import on_one_machine

    m = Measurement(index=0, repeat=0, strategy="horovod", np=2)
    m.reports = [report(r, 2, 1, 1.0, host="ab"[r], boot_id="k1") for r in range(2)]
    m.ranks_reported = 2
    assert on_one_machine(m)
    assert on_one_machine(m, "k1")
    assert not on_one_machine(m, "k2")
    assert oversubscription(m) == 1.0  # 2 ranks x 1 thread on the 2 cores they share
    m.reports[1]["boot_id"] = "k2"
    assert not on_one_machine(m)


def test_the_link_applies_to_runs_over_it():
    local = Measurement(index=0, repeat=0, strategy="ddp", np=2, hosts=["a", "a"])
    spread = Measurement(index=0, repeat=0, strategy="ddp", np=2, hosts=["a", "b"])
    assert link_applies({"kind": "loopback"}, local)
    assert not link_applies({"kind": "loopback"}, spread)
    assert link_applies({"kind": "between hosts"}, spread)
    assert not link_applies({"kind": "between hosts"}, local)
    assert not link_applies({"error": "failed", "kind": "loopback"}, local)
    assert not link_applies(None, local)


def test_annotate_predicts_every_measured_row_and_projects():
    body = sample_body()
    annotate(body)
    assert body["model"]["compute_s"] == pytest.approx(0.1)
    expected = predict(StepModel(0.1, 0.06, 1_572_864, Method("fp16")), 2, 1e-4, 1e8).efficiency
    fp16 = next(r for r in body["rows"] if r["strategy"] == "horovod-fp16")
    assert fp16["model_efficiency"] == pytest.approx(expected)
    entries = {e["strategy"]: e for e in body["validation"]}
    assert set(entries) == {"ddp", "horovod-fp16"}
    assert entries["ddp"]["error"] == pytest.approx(entries["ddp"]["predicted_efficiency"] - 0.8)
    wires = {(p["interconnect"], p["method"]) for p in body["projection"]}
    assert ("measured", "fp32") in wires
    assert ("NVLink4", "fp16") in wires
    assert ("25GbE", "fp32") in wires
    assert {e["method"] for e in body["validation"]} == {"fp32", "fp16"}


def test_without_a_link_there_is_a_projection_but_no_validation():
    body = sample_body(link=False)
    annotate(body)
    assert body["validation"] == []
    assert body["projection"]
    assert all(p["interconnect"] != "measured" for p in body["projection"])


def test_without_a_baseline_the_model_says_what_it_needs():
    body = sample_body()
    body["runs"] = [r for r in body["runs"] if r["strategy"] != "single"]
    annotate(body)
    assert "gradient_bytes" in body["model"]["error"]
    assert body["projection"] == []


def test_the_copies_lockstep_ceiling_is_the_compute_slowdown_of_a_synchronous_row():
    from ringtrain.bench.records import summarize
    from tests.bench.helpers import body

    copies = measurement(1, "independent", 2, 0, 80.0)
    copies.lockstep_items_per_second = 140.0  # efficiency 0.7, below the copies' 0.8
    runs = [measurement(0, "single", 1, 0, 100.0), copies, measurement(2, "ddp", 2, 0, 60.0)]
    result = body(runs, {"kind": "loopback", "alpha_s": 1e-4, "beta_bytes_per_s": 1e8},
                  strategies=("single", "independent", "ddp"))
    result["rows"] = [r.as_dict() for r in summarize(runs)]
    annotate(result)
    (entry,) = result["validation"]
    assert entry["oversubscription"] == pytest.approx(1 / 0.7)


def test_independent_copies_give_the_measured_compute_slowdown():
    from ringtrain.bench.records import summarize
    from tests.bench.helpers import body

    runs = [measurement(0, "single", 1, 0, 100.0), measurement(1, "independent", 2, 0, 80.0),
            measurement(2, "ddp", 2, 0, 70.0)]
    result = body(runs, {"kind": "loopback", "alpha_s": 1e-4, "beta_bytes_per_s": 1e8},
                  strategies=("single", "independent", "ddp"))
    result["rows"] = [r.as_dict() for r in summarize(runs)]
    annotate(result)
    (entry,) = result["validation"]
    assert entry["compute_factor_from"] == "independent"
    assert entry["oversubscription"] == pytest.approx(1 / 0.8)
    expected = predict(StepModel(0.1, 0.06, 1_572_864), 2, 1e-4, 1e8, oversubscription=1 / 0.8)
    assert entry["predicted_efficiency"] == pytest.approx(expected.efficiency)


def test_the_barrier_ranks_give_the_compute_slowdown_and_are_neither_validated_nor_projected():
    from ringtrain.bench.records import summarize
    from tests.bench.helpers import body

    copies = measurement(1, "independent", 2, 0, 80.0)
    copies.lockstep_items_per_second = 150.0
    runs = [measurement(0, "single", 1, 0, 100.0), copies, measurement(2, "barrier", 2, 0, 70.0),
            measurement(3, "horovod", 2, 0, 65.0)]
    result = body(runs, {"kind": "loopback", "alpha_s": 1e-4, "beta_bytes_per_s": 1e8},
                  strategies=("single", "independent", "barrier", "horovod"))
    result["rows"] = [r.as_dict() for r in summarize(runs)]
    annotate(result)
    (entry,) = result["validation"]  # horovod only: the references are not competitors
    assert entry["strategy"] == "horovod"
    # measured lockstep (0.7) is preferred over the copies' computed ceiling (0.75)
    assert entry["compute_factor_from"] == "barrier"
    assert entry["oversubscription"] == pytest.approx(1 / 0.7)
    assert {p["method"] for p in result["projection"]} == {"fp32"}
    assert result["method_that_pays"] == []  # one method: nothing to choose between


def test_projection_and_validation_only_when_asked():
    body = sample_body()
    annotate(body, project=False, validate=False)
    assert body["model"]["compute_s"] > 0  # the inputs stay in scaling.json
    assert body["projection"] == []
    assert body["validation"] == []
    assert all(r.get("model_efficiency") is None for r in body["rows"])
    body = sample_body()
    annotate(body, project=True, validate=False)
    assert body["projection"]
    assert body["validation"] == []
    body = sample_body()
    annotate(body, project=False, validate=True)
    assert body["projection"] == []
    assert body["validation"]


def test_every_method_of_the_sweep_is_validated_and_projected_from_the_baselines_shapes():
    body = method_sweep()
    annotate(body)
    methods = {"fp32": FP32, "powersgd:4": Method("powersgd", rank=4), "localsgd:8": local_sgd(8)}
    assert set(body["model"]["methods"]) == set(methods)
    assert body["model"]["methods"]["powersgd:4"]["rounds_per_bucket"] == 2
    assert body["model"]["methods"]["localsgd:8"]["steps_per_exchange"] == 8
    entries = {e["strategy"]: e for e in body["validation"]}
    assert {s: e["method"] for s, e in entries.items()} == {
        "horovod": "fp32", "horovod-powersgd4": "powersgd:4", "horovod-localsgd8": "localsgd:8"}
    for strategy, entry in entries.items():
        model = StepModel.for_shapes(0.1, 0.06, SHAPES, methods[entry["method"]])
        expected = predict(model, 2, 1e-4, 1e8, oversubscription=entry["oversubscription"])
        assert entry["predicted_efficiency"] == pytest.approx(expected.efficiency), strategy
    assert [p["method"] for p in body["projection"] if p["interconnect"] == "25GbE"] == list(methods)
    pays = {e["interconnect"]: e for e in body["method_that_pays"]}
    assert set(pays) == {"25GbE", "100GbE", "IB-HDR200", "NVLink4", "measured"}
    for point in pays["measured"]["points"]:
        assert set(point["step_s"]) == set(methods)
        assert point["fastest"] == min(point["step_s"], key=point["step_s"].get)
    annotate(body, project=False)
    assert body["method_that_pays"] == []


def test_a_result_file_without_shapes_takes_powersgds_ratio_from_its_runs():
    body = method_sweep(shapes=False)
    annotate(body)
    with_shapes = method_sweep()
    annotate(with_shapes)
    for label, facts in with_shapes["model"]["methods"].items():
        assert body["model"]["methods"][label] == pytest.approx(facts), label
    # nor shapes nor a reported ratio: PowerSGD has no model, the others still have theirs
    for run in body["runs"]:
        for rank_report in run["reports"]:
            rank_report.pop("compression_ratio", None)
    annotate(body)
    assert set(body["model"]["methods"]) == {"fp32", "localsgd:8"}
    assert "horovod-powersgd4" not in {e["strategy"] for e in body["validation"]}
    assert {p["method"] for p in body["projection"]} == {"fp32", "localsgd:8"}


def test_an_earlier_sweeps_result_file_still_annotates():
    """Written before the other methods: fp16 strategy names, no shapes, projection entries with fp16 only."""
    import json

    from ringtrain.bench.outputs import projection_text, table_text

    path = ROOT / "benchmarks/results/link_sweep_amd-epyc_20261123-0843/1gbit/mnist/scaling.json"
    body = json.loads(path.read_text())
    old_projection = body["projection"]
    assert "method" not in old_projection[0]
    assert "fp32 gradients:" in projection_text(body)  # as it was written, before annotating again
    annotate(body)
    assert {e["strategy"] for e in body["validation"]} >= {"horovod", "horovod-fp16", "ddp", "ddp-fp16"}
    assert {e["method"] for e in body["validation"]} == {"fp32", "fp16"}
    assert {p["method"] for p in body["projection"]} == {"fp32", "fp16"}
    assert [p["efficiency"] for p in body["projection"][0]["points"]] == pytest.approx(
        [p["efficiency"] for p in old_projection[0]["points"]])  # fp32 as the model said it then
    assert body["method_that_pays"]
    assert "wire/step" not in table_text(body)
    assert "METHOD THAT PAYS" in projection_text(body)
