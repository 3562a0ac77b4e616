"""The order of data sources: data_dir > cache > download > embedded, and the errors on the way."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from ringtrain.workloads import DataError, get_workload
from ringtrain.workloads.download import md5sum
from ringtrain.workloads.idx import write_idx
from ringtrain.workloads.mnist import EMBEDDED_MNIST, MNIST, MnistWorkload
from ringtrain.workloads.sources import cache_root
from tests.ranks import run_ranks
from tests.workloads.helpers import serve_folder


def _write_mnist(folder: Path, train: int, test: int = 4) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", np.zeros((count, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.zeros(count, dtype=np.uint8))
    return folder


def _served_embedded_copy(tmp_path: Path) -> tuple[Path, MnistWorkload]:
    """A mirror folder holding copies of the embedded files, and a workload that downloads from it."""
    mirror = tmp_path / "mirror"
    shutil.copytree(EMBEDDED_MNIST, mirror)
    spec = dataclasses.replace(MNIST, md5={p.name: md5sum(p) for p in mirror.glob("*.gz")})
    return mirror, MnistWorkload(spec)


def test_cache_root_order(tmp_path: Path) -> None:
    assert cache_root(tmp_path / "a", {"RINGTRAIN_DATA": str(tmp_path / "b")}) == tmp_path / "a"
    assert cache_root(None, {"RINGTRAIN_DATA": str(tmp_path / "b")}) == tmp_path / "b"
    assert cache_root(None, {}) == Path.home() / ".cache" / "ringtrain"


def test_data_dir_wins_over_the_cache(tmp_path: Path, isolated_cache: Path) -> None:
    _write_mnist(isolated_cache / "mnist", train=7)
    _write_mnist(tmp_path / "mine", train=5)
    wl = get_workload("mnist")
    train, _ = wl.datasets(data_dir=tmp_path / "mine")
    assert len(train) == 5
    assert wl.source is not None
    assert wl.source.kind == "data_dir"


def test_cache_wins_over_download_and_embedded(tmp_path: Path, isolated_cache: Path) -> None:
    _write_mnist(isolated_cache / "mnist", train=7)
    wl = get_workload("mnist")
    # download=True must not fetch anything when the cache already has the files
    train, _ = wl.datasets(download=True)
    assert len(train) == 7
    assert wl.source is not None
    assert wl.source.kind == "cache"


def test_explicit_cache_dir_beats_the_environment(tmp_path: Path) -> None:
    _write_mnist(tmp_path / "explicit" / "mnist", train=3)
    wl = get_workload("mnist")
    train, _ = wl.datasets(cache_dir=tmp_path / "explicit")
    assert len(train) == 3
    assert wl.source is not None
    assert wl.source.kind == "cache"


def test_download_wins_over_embedded(tmp_path: Path, isolated_cache: Path) -> None:
    mirror, wl = _served_embedded_copy(tmp_path)
    with serve_folder(mirror) as url:
        wl.spec = dataclasses.replace(wl.spec, mirrors=(url,))
        train, test = wl.datasets(download=True)
    assert wl.source is not None
    assert wl.source.kind == "download"
    assert wl.source.folder == isolated_cache / "mnist"
    assert (len(train), len(test)) == (10000, 2000)
    # the next call finds the downloaded copy in the cache, with no server running
    again = MnistWorkload(wl.spec)
    again.datasets()
    assert again.source is not None
    assert again.source.kind == "cache"


def test_embedded_is_last_and_needs_no_download() -> None:
    wl = get_workload("mnist")
    train, _ = wl.datasets(download=False)
    assert wl.source is not None
    assert wl.source.kind == "embedded"
    assert len(train) == 10000


def test_missing_data_dir_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    with pytest.raises(DataError) as info:
        get_workload("mnist").datasets(data_dir=missing)
    assert str(missing) in str(info.value)
    assert "HINT:" in str(info.value)


def test_data_dir_without_the_files(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="does not hold the mnist files") as info:
        get_workload("mnist").datasets(data_dir=tmp_path / "empty")
    assert "HINT:" in str(info.value)


def test_a_partial_data_dir_names_the_missing_file(tmp_path: Path) -> None:
    folder = _write_mnist(tmp_path / "mnist", train=3)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as info:
        get_workload("mnist").datasets(data_dir=tmp_path)
    assert f"{folder} lacks t10k-labels-idx1-ubyte.gz" in str(info.value)


def test_a_partial_cache_is_skipped(isolated_cache: Path) -> None:
    folder = _write_mnist(isolated_cache / "mnist", train=7)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    wl = get_workload("mnist")
    wl.datasets()
    assert wl.source is not None
    assert wl.source.kind == "embedded"


def test_no_embedded_copy_means_a_clear_error(isolated_cache: Path) -> None:
    with pytest.raises(DataError) as info:
        get_workload("fashion-mnist").datasets()
    message = str(info.value)
    assert str(isolated_cache) in message
    assert "download=True" in message
    assert "HINT:" in message


def test_failed_download_falls_through_to_nothing_but_an_error(tmp_path: Path, isolated_cache: Path) -> None:
    mirror, wl = _served_embedded_copy(tmp_path)
    (mirror / "t10k-labels-idx1-ubyte.gz").unlink()
    with serve_folder(mirror) as url:
        wl.spec = dataclasses.replace(wl.spec, mirrors=(url,))
        with pytest.raises(DataError, match="could not download t10k-labels-idx1-ubyte.gz"):
            wl.datasets(download=True)


def _download_in_a_rank(spec: object, cache: str) -> tuple[str, int]:
    # meet the other rank first (a file each), so that both ask for the download at the same time
    meeting = Path(cache).parent
    (meeting / f"ready-{os.environ['RANK']}").touch()
    deadline = time.monotonic() + 120
    while len(list(meeting.glob("ready-*"))) < int(os.environ["WORLD_SIZE"]):
        assert time.monotonic() < deadline, "the other rank never arrived"
        time.sleep(0.01)
    wl = MnistWorkload(spec)  # type: ignore[arg-type]
    train, _ = wl.datasets(download=True, cache_dir=cache)
    assert wl.source is not None
    return wl.source.kind, len(train)


@pytest.mark.slow
def test_ranks_sharing_a_cache_download_once(tmp_path: Path) -> None:
    mirror, wl = _served_embedded_copy(tmp_path)
    requests: list[str] = []
    with serve_folder(mirror, requests) as url:
        spec = dataclasses.replace(wl.spec, mirrors=(url,))
        results = run_ranks(2, _download_in_a_rank, spec, str(tmp_path / "shared-cache"), timeout=300)
    # one rank downloads, the other waits for the lock and then finds the files in place
    assert sorted(kind for kind, _ in results) == ["download", "download"]
    assert [n for _, n in results] == [10000, 10000]
    assert sorted(requests) == sorted(f"/{name}" for name in spec.md5)
