"""Fixtures of the workloads tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.workloads.helpers import SHARED_DATA


@pytest.fixture
def shared_data() -> Path:
    """The shared offline datasets folder, or a skip when it is absent."""
    if not (SHARED_DATA / "mnist").is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent (it sits beside the repository in CI)")
    return SHARED_DATA.resolve()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One compute thread, as every rank uses: the machine's few cores are shared by all tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets an empty cache folder of its own, so the user's ~/.cache never leaks in."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("RINGTRAIN_DATA", str(cache))
    return cache
