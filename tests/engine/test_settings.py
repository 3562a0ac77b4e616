"""The settings object: every knob read once, every bad value refused with a clear error."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.engine import world_rendezvous
from ringtrain.engine.settings import Choice, Number, Settings, knob_of, knobs, markdown_table
from ringtrain.exceptions import SettingError
from tests.engine.settings_examples import bad_examples

REPO = Path(__file__).resolve().parents[2]
FIELDS = dataclasses.fields(Settings)
BAD = [
    pytest.param(f.name, value, id=f"{knob_of(f).variable}={value}")
    for f in FIELDS
    for value in bad_examples(knob_of(f).kind)
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
        assert bad_examples(knob_of(f).kind), f.name
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
#: Modules that set these variables for other processes (the launcher), not read them for themselves.
_WRITERS = ("launch/", "cli/", "shim/")


def test_no_module_but_settings_reads_a_knob():
    """Every knob has one reader: nothing else in the package reads these variables."""
    readers = []
    for path in sorted((REPO / "src" / "ringtrain").rglob("*.py")):
        relative = path.relative_to(REPO / "src" / "ringtrain").as_posix()
        if relative == "engine/settings.py" or relative.startswith(_WRITERS):
            continue
        text = path.read_text()
        for knob in knobs():
            name = re.escape(knob.variable)
            read = (rf"(environ\.get\(\s*|getenv\(\s*|environ\[\s*)[\"']{name}[\"']"
                    rf"|[\"']{name}[\"']\s+(not\s+)?in\s+\w*\.?environ")
            if re.search(read, text):
                readers.append(f"{relative}: {knob.variable}")
    assert readers == [], "read the value from the Settings object instead"


#: The engine and the Horovod API: only the settings module reads the environment (and the store,
#: for the facts of the launch in world_rendezvous.LAUNCH_FACTS, which are not knobs).
_API = ("engine/", "elastic/", "mpi_ops.py", "optimizer.py", "functions.py", "compression.py",
        "process_sets.py", "sync_batch_norm.py", "ops/")
#: settings.py reads the knobs; world_rendezvous.py and elastic_rendezvous.py read (and the latter sets) the
#: launcher's contract: who started this process and where this worker stands in an elastic job.
_ENVIRON_READERS = {"engine/settings.py", "engine/world_rendezvous.py", "engine/elastic_rendezvous.py"}


def test_engine_and_api_modules_do_not_read_the_environment():
    found = set()
    for path in sorted((REPO / "src" / "ringtrain").rglob("*.py")):
        relative = path.relative_to(REPO / "src" / "ringtrain").as_posix()
        lines = [line for line in path.read_text().splitlines() if re.search(r"os\.environ|getenv\(", line)]
        if relative.startswith(_API) and lines:
            found.add(relative)
        if relative == "engine/world_rendezvous.py":
            # only the facts of the launch (torchrun's run and attempt, the job store and secret)
            assert all("LAUNCH_FACTS" in line for line in lines), lines
    launch_facts = set(world_rendezvous.LAUNCH_FACTS)
    assert not {k.variable for k in knobs()} & launch_facts, "a knob belongs in Settings"
    assert found == _ENVIRON_READERS


def test_init_refuses_a_bad_knob_before_touching_the_network():
    """hvd.init() reads the settings first: a bad value stops it with the clear error, no rendezvous."""
    script = ("import ringtrain as hvd\ntry:\n    hvd.init()\n"
              "except ValueError as e:\n    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    env.update(PYTHONPATH=str(REPO / "src"), RINGTRAIN_ROUND_TIMEOUT_SECONDS="0",
               MASTER_ADDR="192.0.2.1", MASTER_PORT="9", RANK="0", WORLD_SIZE="2")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.startswith("SettingError RINGTRAIN_ROUND_TIMEOUT_SECONDS='0' is out of range"), out
