"""Promises the repository makes about itself: the README's commands are what CI runs, no machine paths."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fenced_commands(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _steps(command: str) -> list[str]:
    """The commands of a ``a && b && c`` line, quiet flags and extra blanks left out."""
    return [" ".join(part.replace(" -q", " ").split()) for part in command.split("&&")]


def _ci_commands() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [" ".join(line.replace(" -q", " ").split()) for line in lines
            if line.strip() and not line.lstrip().startswith("#")]


def _quick_start() -> tuple[str, str]:
    """The README's two commands: install and train, and install the test setup and test."""
    commands = _fenced_commands((ROOT / "README.md").read_text())
    train = [c for c in commands if "ringtrain train mnist -np 2" in c]
    test = [c for c in commands if "python -m pytest" in c]
    assert len(train) == 1, "the README must show one command that installs and trains"
    assert len(test) == 1, "the README must show one command that sets up and runs the tests"
    return train[0], test[0]


def test_the_readme_needs_two_commands_on_a_fresh_machine() -> None:
    train, test = _quick_start()
    # the first installs ringtrain without the test tools, then trains
    train_steps = _steps(train)
    assert train_steps[0] == "python3 -m venv .venv"
    assert "pip install -e ." in train_steps
    assert not [s for s in train_steps if "[test]" in s], "users do not need the test extras"
    assert train_steps[-1] == "ringtrain train mnist -np 2"
    # the second sets up the system packages of the integration tests and the test extras
    test_steps = _steps(test)
    assert test_steps[0] == "bash .ci/system-setup"
    assert "pip install -e '.[test]'" in test_steps
    assert test_steps[-1] == "python -m pytest"
    torch_pins = {s for s in train_steps + test_steps + _ci_commands() if s.startswith("pip install torch")}
    assert len(torch_pins) == 1, f"one torch pin everywhere, not {torch_pins}"


def test_ci_runs_the_readme_test_command() -> None:
    _, test = _quick_start()
    ci = _ci_commands()
    # every step of the README's command, in the same order, is a command of .ci/run
    positions = []
    for step in _steps(test):
        assert step in ci, f".ci/run does not run the README's step {step!r}"
        positions.append(ci.index(step))
    assert positions == sorted(positions), ".ci/run runs the README's steps in another order"


def test_no_absolute_paths_of_a_machine() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    offenders = []
    for name in tracked.stdout.split():
        path = ROOT / name
        if path.suffix in {".gz", ".png", ".pt"} or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if re.search(r"/work/(main|shared)|/root/", text) and name != "tests/test_repository.py":
            offenders.append(name)
    assert offenders == [], f"absolute machine paths in {offenders}"


def _imports(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Top-level names of the modules ``tree`` imports: (when the module loads, only when a function runs).

    Imports inside ``try: ... except ImportError`` are left out: the code works without them.
    """
    guarded: set[int] = set()
    in_functions: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            guarded |= {id(n) for statement in node.body for n in ast.walk(statement)}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_functions |= {id(n) for n in ast.walk(node)}
    at_load, lazily = set(), set()
    for node in ast.walk(tree):
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = {node.module.split(".")[0]}
        if names and id(node) not in guarded:
            (lazily if id(node) in in_functions else at_load).update(names)
    return at_load, lazily


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[]", requirement)[0] for requirement in requirements}


def test_the_minimal_install_has_every_package_the_code_imports() -> None:
    # The README's first command installs ringtrain without extras: every module must load with the
    # dependencies alone, and an extra (plot, tensorboard) may only be imported where it is used.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _requirement_names(project["dependencies"])
    extras = set().union(*(_requirement_names(r) for r in project["optional-dependencies"].values()))
    ours = set(sys.stdlib_module_names) | {"ringtrain", "horovod", "__future__"}
    at_load, lazily = set(), set()
    for path in (ROOT / "src" / "ringtrain").rglob("*.py"):
        loaded, used = _imports(ast.parse(path.read_text(), str(path)))
        at_load |= loaded - ours
        lazily |= used - ours
    assert at_load <= installed, f"imported on load, not a dependency: {sorted(at_load - installed)}"
    missing = sorted(lazily - installed - extras)
    assert not missing, f"imported, but in no dependency or extra: {missing}"
