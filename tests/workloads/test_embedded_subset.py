"""The embedded MNIST subset: its provenance, its licence, and that the wheel carries it."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import torch

from ringtrain.workloads.embedded_subset import write_subset
from ringtrain.workloads.idx import read_idx
from ringtrain.workloads.mnist import EMBEDDED_MNIST

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_subset_is_the_first_items_of_the_real_files(shared_data: Path, tmp_path: Path) -> None:
    for name, count in [("train-images-idx3-ubyte", 10000), ("train-labels-idx1-ubyte", 10000),
                        ("t10k-images-idx3-ubyte", 2000), ("t10k-labels-idx1-ubyte", 2000)]:
        embedded = read_idx(EMBEDDED_MNIST / f"{name}.gz")
        real = read_idx(shared_data / "mnist" / f"{name}.gz")
        assert torch.equal(embedded, real[:count]), name
    # and the build script reproduces the shipped files byte for byte
    write_subset(shared_data / "mnist", tmp_path)
    for path in EMBEDDED_MNIST.glob("*.gz"):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_embedded_subset_has_its_licence_beside_it() -> None:
    readme = (EMBEDDED_MNIST / "README.md").read_text()
    licence = (EMBEDDED_MNIST / "LICENSE.txt").read_text()
    assert "10,000" in readme
    assert "2,000" in readme
    assert "CC BY-SA 3.0" in licence or "Attribution-ShareAlike 3.0" in licence
    assert "LeCun" in licence
    assert "Cortes" in licence


def test_package_data_globs_cover_every_embedded_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["*"]
    files = [p for p in EMBEDDED_MNIST.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) == 6
    for path in files:
        assert any(fnmatch.fnmatch(path.name, g) for g in globs), f"{path.name} would not be packaged"


def test_size_stays_small() -> None:
    total = sum(p.stat().st_size for p in EMBEDDED_MNIST.glob("*.gz"))
    assert total < 2_500_000
