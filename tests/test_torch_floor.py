"""The oldest torch ringtrain claims: refused below it in one line, and the same floor everywhere it is
written (pyproject, the package, the CI lanes that test it)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import ringtrain

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("version", "release"), [
    ("2.4.1+cu121", (2, 4)),
    ("2.13.0+cpu", (2, 13)),
    ("2.6.0a0+git1234abc", (2, 6)),
    ("2.10.0.dev20250101", (2, 10)),
    ("10.0", (10, 0)),
    ("nightly", None),
    ("2", None),
])
def test_a_torch_version_string_is_read_as_its_release(version: str, release: tuple[int, int] | None) -> None:
    assert ringtrain._torch_release(version) == release


def _fake_torch(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment whose first torch distribution on the path is ``version`` (metadata only)."""
    info = tmp_path / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}


def test_an_older_torch_is_refused_at_import_in_one_line(tmp_path: Path) -> None:
    env = _fake_torch(tmp_path, "2.3.1")
    # the console script's path: `ringtrain --help` imports the package first
    done = subprocess.run([sys.executable, "-m", "ringtrain", "--help"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "torch 2.4 or newer" in lines[0]
    assert "has torch 2.3.1" in lines[0]
    assert "pip install 'torch>=2.4'" in lines[0]
    assert "Traceback" not in done.stderr


def test_code_that_catches_the_refusal_gets_an_import_error(tmp_path: Path) -> None:
    env = _fake_torch(tmp_path, "2.2.0")
    code = ("try:\n    import ringtrain\nexcept ImportError as error:\n    print(type(error).__name__)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "_TorchTooOldError"
    assert done.stderr == ""


def test_the_floor_itself_is_accepted(tmp_path: Path) -> None:
    env = _fake_torch(tmp_path, "2.4.0")
    done = subprocess.run([sys.executable, "-c", "import ringtrain; print(ringtrain.__version__)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ringtrain.__version__


def _floor_text() -> str:
    return ".".join(map(str, ringtrain._TORCH_FLOOR))


def test_pyproject_requires_the_floor() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch == [f"torch>={_floor_text()}"]


def _lanes() -> list[tuple[str, str]]:
    """(torch, python) of every `bash .ci/torch-lane` line of .ci/run."""
    ci = (ROOT / ".ci" / "run").read_text()
    return re.findall(r"^bash \.ci/torch-lane (\S+) (\S+)\s*$", ci, flags=re.M)


def test_ci_tests_the_floor_and_a_newer_release() -> None:
    lanes = _lanes()
    releases = sorted(ringtrain._torch_release(torch) for torch, _ in lanes)
    assert len(releases) >= 2, f"CI needs a lane on the floor and one on a newer release: {lanes}"
    assert releases[0] == ringtrain._TORCH_FLOOR, f"no lane on torch {_floor_text()}: {lanes}"
    assert releases[-1] > (2, 13), f"no lane newer than the suite's torch: {lanes}"


def test_the_readme_claims_exactly_the_versions_ci_tests() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())  # a claim may wrap across lines
    assert f"torch {_floor_text()} or newer" in readme
    for torch, python in _lanes():
        assert f"torch {torch} (Python {python})" in readme, f"the README does not name the lane {torch}"
    assert "from 2.3" not in readme
