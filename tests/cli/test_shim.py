"""``ringtrain shim-path``: the path alone when captured; on a terminal, how plain python runs a script."""

from __future__ import annotations

import sys

from ringtrain.cli.main import main
from ringtrain.shim import SHIM_DIR


def test_shim_path_on_a_terminal_also_says_how_plain_python_runs_a_script(capsys, monkeypatch):
    assert main(["shim-path"]) == 0  # captured, as by $(ringtrain shim-path): the path alone
    captured = capsys.readouterr()
    assert (captured.out.strip(), captured.err) == (str(SHIM_DIR), "")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["shim-path"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(SHIM_DIR)
    assert "python -m ringtrain.shim train.py" in captured.err
