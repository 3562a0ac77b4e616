"""The settings object: every knob read once, every bad value refused with a clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ringtrain.engine.settings import Choice, Number, Settings, knob_of, knobs, markdown_table
from ringtrain.exceptions import SettingError

REPO = Path(__file__).resolve().parents[2]
FIELDS = dataclasses.fields(Settings)
BAD = [
    pytest.param(f.name, value, id=f"{knob_of(f).variable}={value}")
    for f in FIELDS
    for value in knob_of(f).kind.bad_examples()
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_every_knob_refuses_a_bad_value_naming_variable_value_unit_and_fix(name, value):
    knob = knob_of(next(f for f in FIELDS if f.name == name))
    with pytest.raises(SettingError) as info:
        Settings.from_environ({knob.variable: value})
    message = str(info.value)
    assert message.startswith(f"{knob.variable}={value!r} ")
    assert knob.unit in message
    assert "HINT:" in message
    assert f"unset {knob.variable} for the default ({knob.shown_default})" in message


def test_every_field_is_a_knob_with_bad_examples_and_a_unique_variable():
    variables = [knob.variable for knob in knobs()]
    assert len(set(variables)) == len(variables)
    for f in FIELDS:
        assert knob_of(f).kind.bad_examples(), f.name
        assert knob_of(f).meaning, f.name


def test_unset_and_empty_give_the_defaults():
    defaults = Settings()
    assert Settings.from_environ({}) == defaults
    empty = {knob.variable: "" for knob in knobs() if knob.variable != "HOROVOD_TIMELINE"}
    assert Settings.from_environ(empty) == defaults
    assert defaults.cycle_time_ms == 1.0
    assert defaults.fusion_threshold_bytes == 128 * 1024 * 1024
    assert defaults.timeline is None


def test_good_values_are_read_in_their_units():
    settings = Settings.from_environ({
        "HOROVOD_FUSION_THRESHOLD": "1e6",
        "HOROVOD_CYCLE_TIME": "0.5",
        "HOROVOD_CACHE_CAPACITY": "0",
        "HOROVOD_STALL_CHECK_DISABLE": "yes",
        "HOROVOD_TIMELINE_MARK_CYCLES": "True",
        "HOROVOD_DYNAMIC_PROCESS_SETS": "2",
        "HOROVOD_ELASTIC": "0",
        "RINGTRAIN_CONTROL_PLANE": "GLOO",
        "RINGTRAIN_CPU_ALLREDUCE": " gloo ",
        "RINGTRAIN_ROUND_TIMEOUT_SECONDS": "0.5",
        "RINGTRAIN_BUCKET_CAP_MB": "0",
        "HOROVOD_TIMELINE": "",
        "GLOO_SOCKET_IFNAME": "lo",
    })
    assert settings.fusion_threshold_bytes == 1_000_000
    assert isinstance(settings.fusion_threshold_bytes, int)
    assert settings.cycle_time_ms == 0.5
    assert settings.cache_capacity == 0
    assert settings.stall_check_disable
    assert settings.timeline_mark_cycles
    assert settings.dynamic_process_sets
    assert not settings.elastic
    assert (settings.control_plane, settings.cpu_allreduce) == ("gloo", "gloo")
    assert settings.round_timeout_s == 0.5
    assert settings.bucket_cap_mb == 0.0
    assert settings.timeline == ""  # set but empty: start_timeline() is allowed, nothing is written yet
    assert settings.gloo_socket_ifname == ("lo",)


def test_round_timeout_zero_is_refused_clearly():
    with pytest.raises(SettingError, match=r"RINGTRAIN_ROUND_TIMEOUT_SECONDS='0' is out of range: it is in "
                                           r"seconds and must be > 0\. HINT:"):
        Settings.from_environ({"RINGTRAIN_ROUND_TIMEOUT_SECONDS": "0"})


def test_cycle_time_names_its_unit():
    with pytest.raises(SettingError, match=r"HOROVOD_CYCLE_TIME='-5' .* in milliseconds and must be >= 0"):
        Settings.from_environ({"HOROVOD_CYCLE_TIME": "-5"})


def test_setting_error_is_a_value_error():
    with pytest.raises(ValueError, match="HOROVOD_CACHE_CAPACITY"):
        Settings.from_environ({"HOROVOD_CACHE_CAPACITY": "lots"})


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().cycle_time_ms = 5.0  # type: ignore[misc]


def test_docs_table_is_the_generated_one():
    text = (REPO / "docs" / "settings.md").read_text()
    assert markdown_table() in text, (
        "docs/settings.md is out of date. HINT: replace its table with the output of "
        "`python -m ringtrain.engine.settings`."
    )
    for knob in knobs():
        assert f"`{knob.variable}`" in text


def test_kinds_describe_units_and_choices():
    for knob in knobs():
        if isinstance(knob.kind, Number):
            assert knob.unit
            assert knob.unit in knob.kind.requirement()
        if isinstance(knob.kind, Choice):
            assert all(repr(option) in knob.kind.requirement() for option in knob.kind.options)
