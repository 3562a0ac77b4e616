"""Promises the repository makes about itself: the README's commands are what CI runs, no machine paths,
nothing loaded or unpickled where a stranger could have written it."""

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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
    # the first installs ringtrain with the plot extra (the first hour's `ringtrain bench` draws
    # scaling.png with matplotlib) and without the test tools, then trains
    train_steps = _steps(train)
    assert train_steps[0] == "python3 -m venv .venv"
    installs = [s for s in train_steps
                if s.startswith("pip install") and not s.startswith("pip install torch")]
    assert installs == ["pip install -e '.[plot]'"], f"install ringtrain with [plot] alone, not {installs}"
    assert not [s for s in train_steps if "test" in s], "users do not need the test extras"
    assert train_steps[-1] == "ringtrain train mnist -np 2"
    # the second sets up the system packages of the integration tests and the test extras
    test_steps = _steps(test)
    assert test_steps[0] == "bash .ci/system-setup"
    assert "pip install -e '.[test,ray,spark]'" in test_steps
    assert test_steps[-1] == "python -m pytest -n auto"
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


#: Every place in the package that unpickles, and why that is safe (docs/security.md).
UNPICKLERS = {
    # broadcast_object / allgather_object: data from the job's own ranks (Horovod's API contract);
    # only processes that proved the job's secret reach the collectives that carry it.
    "src/ringtrain/functions.py": 2,
    # ringtrain.run(func): the call and its results, in a private folder this user's launcher made.
    "src/ringtrain/launch/api.py": 1,
    "src/ringtrain/launch/func_runner.py": 1,
    # elastic Ray executors: the call (worker side) and the results (executor side) in the executor's
    # job store, which only processes that proved the job's secret can write to.
    "src/ringtrain/ray/elastic.py": 1,
    "src/ringtrain/ray/elastic_call.py": 1,
    # and what that job's ranks log for the executor's callbacks (ray_logger.log), in the same store.
    "src/ringtrain/ray/ray_logger.py": 1,
    # ringtrain.spark: the rank's process reads the call its Spark task hands it on a pipe (the driver's
    # pickled function, come in the stage's task binary as every PySpark function does); the task reads
    # the result its own child wrote to a fresh private temp file.
    "src/ringtrain/spark/rank_process.py": 1,
    "src/ringtrain/spark/task.py": 1,
    # CIFAR-10's batches: an Unpickler that refuses every global but numpy's array pieces.
    "src/ringtrain/workloads/cifar.py": 1,
    # background snapshots: a rank and the writer process it started talk over an unnamed socket pair
    # the rank made before starting it (nobody else can connect to it), and the state travels in a memfd
    # only the two hold.
    "src/ringtrain/train/background_snapshots.py": 1,
    "src/ringtrain/train/snapshot_writer.py": 2,
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


# --- the README a newcomer follows -----------------------------------------------------------------

README = ROOT / "README.md"


def _readme() -> str:
    return README.read_text()


def _inline_commands(text: str, program: str) -> list[str]:
    """Every command that starts with ``program`` in a code span or a fenced block of ``text``."""
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    lines = [c for command in _fenced_commands(text) for c in command.split("&&")]
    return [c.strip() for c in spans + lines if c.strip().startswith(program + " ")]


def test_the_readme_is_short_and_says_where_gpus_stand() -> None:
    text = _readme()
    assert len(text.splitlines()) <= 120, "the README is the first page a newcomer reads: at most ~120 lines"
    # what has run on a GPU, and what has not (docs/gpu.md's status table holds the evidence)
    assert "verified on one gpu only" in text.lower()
    assert "not yet run: several gpus per node" in text.lower()
    assert "benchmarks/results/gpu/" in (ROOT / "docs" / "gpu.md").read_text()
    assert "(docs/gpu.md)" in text
    # a code sample of 10-15 lines comes before the quick start
    sample = re.search(r"```python\n(.*?)```", text, flags=re.S)
    assert sample
    assert text.index(sample[0]) < text.index("## Quick start")
    assert 10 <= len(sample[1].splitlines()) <= 16
    for section in ("## Quick start", "## Your first hour", "| You have | Do |", "## Performance"):
        assert section in text, f"the README lost its {section!r}"
    assert "## Layout" not in text, "the layout is contributor material: docs/architecture.md"


def test_the_readme_code_sample_runs() -> None:
    sample = re.search(r"```python\n(.*?)```", _readme(), flags=re.S)
    assert sample
    # one process, as `python train.py` runs it: hvd.init() finds no launcher and makes a job of one
    launcher_vars = ("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_", "RINGTRAIN_", "HOROVOD_", "SLURM_", "PBS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_vars)}
    result = subprocess.run([sys.executable, "-c", sample[1]], capture_output=True, text=True, timeout=300,
                            env={**env, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"rank 0 of 1: loss \d+\.\d{3}\n", result.stdout), result.stdout


def test_the_readme_says_what_the_test_command_costs() -> None:
    text = _readme()
    _, test = _quick_start()
    # the prose between the block before and the test command's own block
    start = text.index("```bash\n" + test)
    paragraph = text[text.rindex("```", 0, start) + 3:start]
    assert re.search(r"about \d+ minutes", paragraph), "say how long the tests take"
    assert "root" in paragraph
    assert "apt-get" in paragraph
    # what .ci/system-setup installs, in words a newcomer knows
    for name in ("Slurm", "Open MPI", "MPICH", "sshd", "iproute2"):
        assert name in paragraph, f"the README does not say that .ci/system-setup installs {name}"
    setup = (ROOT / ".ci" / "system-setup").read_text()
    for package in ("slurmctld", "openmpi-bin", "mpich", "openssh-server", "iproute2"):
        assert package in setup


def test_every_ringtrain_command_of_the_readme_parses() -> None:
    from ringtrain.cli.main import build_parser

    commands = [c for c in _inline_commands(_readme(), "ringtrain") if "{" not in c]
    assert len(commands) >= 12, commands
    for command in commands:
        parser = build_parser()
        try:
            args = parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:
            raise AssertionError(f"the README's `{command}` does not parse (exit {exc.code})") from None
        assert getattr(args, "func", None) is not None, f"`{command}` names no subcommand"
    # the first hour's steps, as the issue asks for them
    for step in ("ringtrain run -np 2 ringtrain check", "ringtrain bench --np 1,2 -- python examples/"):
        assert any(c.startswith(step) for c in commands), f"the first hour lacks {step!r}"


def test_the_files_the_readme_commands_name_exist() -> None:
    text = _readme()
    named = re.findall(r"\b(examples/[\w./-]+\.py)\b", text)
    assert named, "the first hour runs an example of the repository"
    assert [n for n in named if not (ROOT / n).is_file()] == []
    for command in _inline_commands(text, "python"):
        if command.startswith("python -m ringtrain.shim "):
            assert (ROOT / shlex.split(command)[3]).is_file(), command


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "benchmarks/README.md", "examples/README.md"])
def test_relative_links_lead_to_files(page: str) -> None:
    path = ROOT / page
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    missing = [link for link in links if "://" not in link and not (path.parent / link).exists()]
    assert missing == [], f"{page} links to files that do not exist: {missing}"


def test_the_docs_index_lists_every_page_once() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    listed = re.findall(r"^\| \[([\w.-]+\.md)\]", index, flags=re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert sorted(listed) == pages, "docs/index.md must list every page of docs/, one line each"
    assert "docs/index.md" in _readme()


def test_the_license_file_matches_pyproject() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] in ({"text": "Apache-2.0"}, "Apache-2.0")


@pytest.mark.slow
def test_the_quick_start_prints_the_accuracy_the_readme_quotes(tmp_path: Path) -> None:
    train, _ = _quick_start()
    words = shlex.split(_steps(train)[-1])
    assert words[0] == "ringtrain"
    # a fresh machine: no data in the cache, so the embedded MNIST; nothing of this machine's launchers
    env = {**os.environ, "RINGTRAIN_DATA": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    # Flags that only choose where results go (the run trains what the README's command trains): this
    # run is also `ringtrain train`'s two-rank end-to-end check (once a job of its own in
    # tests/cli/test_train.py), so that the suite starts one such job, not two.
    results, logs = tmp_path / "results.json", tmp_path / "logs"
    result = subprocess.run([sys.executable, "-m", "ringtrain", *words[1:], "--no-progress", "--results-json",
                             str(results), "--log-dir", str(logs)], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    done = re.search(r"done: 4 epoch\(s\) in [\d.]+s, test accuracy (\d+\.\d+)%", result.stdout)
    assert done, result.stdout
    # Deterministic on one kind of CPU; another's kernels (AVX-512 or not) round differently, by a few
    # hundredths of a percent: the README's figure, to a quarter of a point, is what a user checks
    quoted = re.search(r"test accuracy (\d+\.\d+)%", _readme())
    assert quoted, "the README quotes no accuracy of its quick start"
    assert abs(float(done[1]) - float(quoted[1])) <= 0.25, \
        f"the quick start printed {done[1]} %, the README says {quoted[1]} %"
    # ringtrain train end to end on two ranks: the last epoch's line, the results file, one metrics row
    # an epoch below the header
    assert "epoch 4/4" in result.stdout
    assert "accuracy" in result.stdout
    body = json.loads(results.read_text())
    assert body["world_size"] == 2
    assert body["epochs"][-1]["accuracy"] > 0.6
    assert (logs / "metrics.csv").read_text().count("\n") == 5
