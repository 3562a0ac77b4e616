"""examples/README.md: every "How to run it" line runs from a fresh clone as written.

Cheap checks here (the script exists, the launcher's flags and the script's own flags parse, nothing
points at a data folder beside the repository); the slow tests beside this file run the lines'
fresh-clone paths (embedded MNIST, synthetic CIFAR-10 and MovieLens) on 2 ranks.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys

import pytest

from ringtrain.cli.main import build_parser
from ringtrain.shim import SHIM_DIR
from tests.examples.launch import EXAMPLES

README = EXAMPLES / "README.md"


def _rows() -> list[tuple[str, list[str]]]:
    """(script, its run commands) for each row of the README's table."""
    rows = []
    for line in README.read_text().splitlines():
        match = re.match(r"^\| `(\w+\.py)` \|.*\| (.*) \|$", line)
        if match:
            commands = [c for c in re.findall(r"`([^`]+)`", match[2])
                        if c.startswith(("ringtrain run", "python -m torch.distributed.run"))]
            rows.append((match[1], commands))
    return rows


def _script_argv(command: list[str], script: str) -> list[str]:
    """The arguments a command gives ``examples/<script>``."""
    return command[command.index(f"examples/{script}") + 1:]


def test_every_example_has_a_line_and_every_line_its_script() -> None:
    rows = _rows()
    assert sorted(script for script, _ in rows) == sorted(p.name for p in EXAMPLES.glob("*.py"))
    for script, commands in rows:
        assert commands, f"examples/README.md gives no command for {script}"
        for command in commands:
            assert f"examples/{script}" in command, command
            assert "shared" not in command, f"{command!r} needs a data folder a fresh clone lacks"


def test_the_launcher_flags_of_every_line_parse() -> None:
    for _, commands in _rows():
        for command in commands:
            words = shlex.split(command)
            if words[0] != "ringtrain":
                continue
            try:
                build_parser().parse_args(words[1:])
            except SystemExit as exc:
                raise AssertionError(f"`{command}` does not parse (exit {exc.code})") from None


def _load(script: str) -> object:
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["horovod_cifar10_resnet.py", "movielens_recommender.py",
                                    "synthetic_benchmark.py", "mnist_cnn_multihost.py", "horovod_mnist.py"])
def test_the_script_flags_of_every_line_parse(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a Horovod script imports `horovod.torch`: the shim, as `ringtrain run` provides it; the modules
    # it loads leave with the test, so that no later test finds a `horovod` it did not ask for
    monkeypatch.syspath_prepend(str(SHIM_DIR))
    before = set(sys.modules)
    try:
        module = _load(script)
    finally:
        for name in set(sys.modules) - before:
            if name.split(".")[0] == "horovod":
                del sys.modules[name]
    commands = dict(_rows())[script]
    for command in commands:
        argv = _script_argv(shlex.split(command), script)
        monkeypatch.setattr(sys, "argv", [script, *argv])
        try:
            module.parse_args()  # type: ignore[attr-defined]
        except SystemExit:
            raise AssertionError(f"examples/{script} refuses the README's arguments {argv}") from None

