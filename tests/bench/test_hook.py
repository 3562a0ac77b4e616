"""The report line: what ringtrain.bench.report prints, and how the sweep reads it back."""

import json

import pytest

import ringtrain.bench
from ringtrain.bench.hook import ENV_VAR, TAG, parse_line, parse_output, reporting


def test_report_prints_one_parsable_line(capsys, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")  # as ringtrain bench sets it for its runs
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    line = ringtrain.bench.report(items=640, seconds=2.5, steps=10, gradient_bytes=1234, note="x")
    out = capsys.readouterr().out
    assert out == line + "\n"
    assert out.startswith(TAG + " ")
    body = json.loads(out[len(TAG) + 1:])
    assert body["items"] == 640
    assert body["seconds"] == 2.5
    assert body["steps"] == 10
    assert body["rank"] == 1
    assert body["world_size"] == 4
    assert body["gradient_bytes"] == 1234
    assert body["note"] == "x"
    assert body["host"]


def test_a_plain_process_is_rank_0_of_1(capsys, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    body = parse_line(ringtrain.bench.report(items=1, seconds=1.0))
    assert (body["rank"], body["world_size"]) == (0, 1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"items": -1, "seconds": 1.0}, "items=-1"),
    ({"items": float("nan"), "seconds": 1.0}, "items=nan"),
    ({"items": 10, "seconds": 0}, "seconds=0"),
    ({"items": 10, "seconds": float("inf")}, "seconds=inf"),
    ({"items": 10, "seconds": 1.0, "epochs": 0}, "epochs=0"),
    ({"items": 10, "seconds": 1.0, "epoch": 1, "epochs": 2}, "epoch=1 and epochs=2"),
])
def test_bad_values_are_refused_with_a_hint(kwargs, message):
    with pytest.raises(ValueError, match="HINT") as info:
        ringtrain.bench.report(**kwargs)
    assert message in str(info.value)


def test_parse_ignores_prefixes_other_lines_and_broken_reports():
    text = "\n".join([
        "epoch 1/1 ...",
        f'[1] {TAG} {{"items": 5, "seconds": 1.0, "rank": 1}}',
        f"{TAG} not json",
        f'{TAG} [1, 2]',
        f'{TAG} {{"items": 7, "seconds": 2.0, "rank": 0}}',
    ])
    assert [b["items"] for b in parse_output(text)] == [5, 7]
    assert parse_line("no tag here") is None


def test_the_hook_stays_callable_after_every_bench_module_is_imported():
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(ringtrain.bench.__path__):
        importlib.import_module(f"ringtrain.bench.{module.name}")
    assert callable(ringtrain.bench.report)


def test_the_parameters_digest_sees_every_bit_of_the_parameters_and_no_buffer():
    import torch

    from ringtrain.bench import parameters_digest

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    twin = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    twin.load_state_dict(model.state_dict())
    assert parameters_digest(model) == parameters_digest(twin)
    twin[1].running_mean += 1.0  # buffers follow each rank's own batches: not compared
    assert parameters_digest(model) == parameters_digest(twin)
    with torch.no_grad():
        bits = twin[0].weight.view(torch.int32)
        bits[0, 0] ^= 1  # the lowest bit of one weight
    assert parameters_digest(model) != parameters_digest(twin)


def test_an_epoch_line_says_which_epoch(capsys):
    line = ringtrain.bench.report(items=640, seconds=2.0, steps=10, epoch=3)
    body = parse_line(line)
    assert body["epoch"] == 3
    assert body["steps"] == 10
    assert "epochs" not in body
    assert parse_line(ringtrain.bench.report(items=640, seconds=2.0, epochs=2))["epochs"] == 2


def test_outside_ringtrain_bench_report_checks_and_returns_the_line_but_prints_nothing(capsys, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    line = ringtrain.bench.report(items=640, seconds=2.0, steps=10, epoch=1)
    assert parse_line(line)["items"] == 640
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match="HINT"):  # a wrong call shows in a plain run too
        ringtrain.bench.report(items=-1, seconds=1.0)


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), ("", False), ("0", False), ("false", False), (" off ", False), ("1", True), ("yes", True),
])
def test_only_a_set_bench_variable_turns_the_line_on(value, expected):
    assert reporting({} if value is None else {ENV_VAR: value}) is expected
