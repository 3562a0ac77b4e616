"""Promises the repository makes about itself: the README's commands are what CI runs, no machine paths."""

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
