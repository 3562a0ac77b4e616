"""Promises the repository makes about itself: the README's commands are what CI runs, no machine paths,
nothing loaded or unpickled where a stranger could have written it."""

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fenced_commands(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = _fenced_commands(readme)
    assert "python -m pytest" in commands, "the README must show the test command"
    assert re.search(r"^python -m pytest\s*$", ci, flags=re.M), ".ci/run must run the README's test command"


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


#: Every place in the package that unpickles, and why that is safe (docs/security.md).
UNPICKLERS = {
    # broadcast_object / allgather_object: data from the job's own ranks (Horovod's API contract);
    # only processes that proved the job's secret reach the collectives that carry it.
    "src/ringtrain/functions.py": 2,
    # ringtrain.run(func): the call and its results, in a private folder this user's launcher made.
    "src/ringtrain/launch/api.py": 1,
    "src/ringtrain/launch/func_runner.py": 1,
    # CIFAR-10's batches: an Unpickler that refuses every global but numpy's array pieces.
    "src/ringtrain/workloads/cifar.py": 1,
}


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            named = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            owner = func.value.id if named else ""
            found.append((f"{owner}.{name}" if owner else name, node))
    return found


def test_torch_load_is_weights_only_and_unpickling_stays_where_it_is_safe() -> None:
    unpicklers: dict[str, int] = {}
    unsafe_loads = []
    for path in sorted((ROOT / "src" / "ringtrain").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        for called, node in _calls(ast.parse(path.read_text())):
            if called == "torch.load":
                weights_only = [k for k in node.keywords if k.arg == "weights_only"]
                if not (weights_only and isinstance(weights_only[0].value, ast.Constant)
                        and weights_only[0].value.value is True):
                    unsafe_loads.append(f"{name}:{node.lineno}")
            if called in ("pickle.load", "pickle.loads", "cloudpickle.load", "cloudpickle.loads",
                          "pickle.Unpickler", "_BatchUnpickler") or called.endswith("Unpickler"):
                unpicklers[name] = unpicklers.get(name, 0) + 1
    assert unsafe_loads == [], "torch.load must pass weights_only=True"
    assert unpicklers == UNPICKLERS, "a new unpickling site: say in UNPICKLERS why its bytes are trusted"
