"""The start-up probe: which commands it can repeat, and that it runs a script's imports, nothing else."""

import sys

import pytest

from ringtrain.bench.startup import EXIT_CANNOT, main, probe_argv, sets_up_process_group, top_level_imports


@pytest.mark.parametrize(("command", "expected"), [
    (["python", "train.py", "--epochs", "1"], ["python", "-m", "ringtrain.bench.startup", "train.py",
                                                "--epochs", "1"]),
    (["python3", "-u", "train.py"], ["python3", "-m", "ringtrain.bench.startup", "train.py"]),
    (["python", "-m", "pkg.train", "--lr", "1"],
     ["python", "-m", "ringtrain.bench.startup", "-m", "pkg.train", "--lr", "1"]),
    (["python", "-c", "pass"], None),
    (["./train.sh"], None),
    (["python", "-m"], None),
])
def test_the_probe_repeats_python_scripts_and_modules_only(command, expected):
    assert probe_argv(command, sys.executable) == expected


def test_only_module_level_imports_are_kept():
    source = ("import json\nfrom os import path\ntry:\n    import horovod.torch as hvd\nexcept ImportError:\n"
              "    hvd = None\nX = open('should-not-run')\ndef f():\n    import socket\n"
              "if __name__ == '__main__':\n    import csv\n")
    module = top_level_imports(source)
    kinds = [type(node).__name__ for node in module.body]
    assert kinds == ["Import", "ImportFrom", "Try"]
    # the handler keeps its imports only: nothing else of the script runs
    assert [type(n).__name__ for n in module.body[2].handlers[0].body] == ["Pass"]


def test_process_group_set_up_is_recognised():
    assert sets_up_process_group("hvd.init()\n")
    assert sets_up_process_group("dist.init_process_group('gloo')\n")
    assert not sets_up_process_group("import json\nprint(initial)\n")


def test_main_runs_the_imports_and_nothing_else(tmp_path, monkeypatch):
    marker = tmp_path / "trained"
    (tmp_path / "helper_mod.py").write_text("VALUE = 1\n")
    script = tmp_path / "train.py"
    script.write_text(f"import json\nimport helper_mod\nopen({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([str(script), "--epochs", "3"]) == 0
    assert not marker.exists()  # the training part did not run
    assert sys.argv == [str(script), "--epochs", "3"]  # as the script would see them


def test_a_failing_import_means_start_up_cannot_be_measured(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("import no_such_module_anywhere\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert main([str(script)]) == EXIT_CANNOT
    assert "no_such_module_anywhere" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.py")]) == EXIT_CANNOT
