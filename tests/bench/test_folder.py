"""The output folder: an earlier sweep refused or cleared (its files only); a result read back."""

import json
from pathlib import Path

import pytest

from ringtrain.bench.folder import earlier_sweep, load_result, prepare_out
from ringtrain.bench.outputs import write_json
from ringtrain.exceptions import UsageError
from tests.bench.helpers import sample_body


def _sweep_in(out: Path) -> None:
    """The files a finished sweep leaves, and one file of the user's beside them."""
    write_json(sample_body(), out / "scaling.json")
    (out / "scaling.csv").write_text("x\n")
    (out / "logs").mkdir()
    for name in ("run-000-np1-single-r1.log", "run-001-np2-ddp-r1.log", "link-probe.log",
                 "startup-000-np1-r1.log"):
        (out / "logs" / name).write_text("$ python\n")


def test_a_new_empty_or_foreign_folder_is_used_as_it_is(tmp_path):
    assert prepare_out(tmp_path / "new") is None
    assert prepare_out(tmp_path) is None  # exists, empty: as tests and users pre-create it
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "mine.log").write_text("mine")
    assert prepare_out(tmp_path) is None
    assert earlier_sweep(tmp_path) == []


def test_a_folder_with_an_earlier_sweep_is_refused_naming_it_and_the_fix(tmp_path):
    _sweep_in(tmp_path)
    with pytest.raises(UsageError) as info:
        prepare_out(tmp_path)
    message = str(info.value)
    earlier = "(scaling.json, scaling.csv, 4 log(s) in logs/)"
    assert f"--out {tmp_path} holds an earlier sweep {earlier}" in message
    assert "HINT: give a new folder (--out DIR), or add --overwrite" in message
    assert "\n" not in message
    assert (tmp_path / "scaling.json").is_file()  # refusing touches nothing


def test_overwrite_removes_only_the_sweeps_own_files_with_a_notice(tmp_path):
    _sweep_in(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "logs" / "mine.log").write_text("mine")
    notice = prepare_out(tmp_path, overwrite=True)
    assert notice == (f"bench: --overwrite: removed the earlier sweep's files from {tmp_path} (scaling.json, "
                      "scaling.csv, 4 log(s) in logs/)")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["logs", "logs/mine.log",
                                                                                 "notes.txt"]
    # with nothing of the user's in logs/, the emptied folder goes too
    only = tmp_path / "only"
    only.mkdir()
    _sweep_in(only)
    prepare_out(only, overwrite=True)
    assert list(only.iterdir()) == []


def test_an_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="that is a file, not a folder. HINT"):
        prepare_out(tmp_path / "f")


def test_a_result_is_read_back_and_bad_ones_name_the_path_and_the_fix(tmp_path):
    write_json(sample_body(), tmp_path / "scaling.json")
    assert load_result(tmp_path)["schema"] == "ringtrain.bench/1"
    cases = {"missing": None, "broken": "{not json", "array": "[1, 2]", "other": json.dumps({"schema": "x"}),
             "rowless": json.dumps({"schema": "ringtrain.bench/1", "rows": [{"np": 1}]}),
             "binary": b"\xff\xfe\x00"}
    messages = {}
    for name, content in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        if isinstance(content, bytes):
            (folder / "scaling.json").write_bytes(content)
        elif content is not None:
            (folder / "scaling.json").write_text(content)
        with pytest.raises(UsageError) as info:
            load_result(folder)
        messages[name] = str(info.value)
        assert "HINT" in messages[name]
        assert str(folder) in messages[name]
    assert "no scaling.json in that folder" in messages["missing"]
    assert "is not valid JSON" in messages["broken"]
    assert "a JSON list, not an object" in messages["array"]
    assert "schema 'x'" in messages["other"]
    assert "row 0 lacks its strategy, np or status" in messages["rowless"]
    assert "is not text" in messages["binary"]
    with pytest.raises(UsageError, match="no such folder"):
        load_result(tmp_path / "nowhere")
