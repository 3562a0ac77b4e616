"""MovieLens ratings: the real ml-latest-small, small CSV files written here, the seeded split."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch

from ringtrain.workloads import DataError, get_workload
from ringtrain.workloads.download import md5sum
from ringtrain.workloads.movielens import MovieLensWorkload, read_ratings
from tests.workloads.helpers import serve_folder, write_ratings

ROWS = [(10, 500, 4.0), (10, 7, 3.5), (3, 500, 1.0), (42, 9, 5.0), (3, 7, 0.5)]


def test_real_ml_latest_small(shared_data: Path) -> None:
    ratings = read_ratings(shared_data / "movielens" / "ml-latest-small" / "ratings.csv")
    assert len(ratings.ratings) == 100836
    assert (ratings.num_users, ratings.num_items) == (610, 9724)
    assert ratings.users.max() == 609
    assert ratings.items.max() == 9723
    assert set(ratings.ratings.tolist()) == {x / 2 for x in range(1, 11)}


def test_workload_on_the_real_file(shared_data: Path) -> None:
    wl = get_workload("movielens")
    train, test = wl.datasets(data_dir=shared_data)  # finds movielens/ml-latest-small below it
    assert len(train) + len(test) == 100836
    assert len(test) == round(100836 * 0.2)
    (users, items), rating = train[0]
    assert users.dtype == torch.int64
    assert rating.dtype == torch.float32
    assert wl.task == "regression"
    assert wl.metric == "rmse"
    assert (wl.num_users, wl.num_items) == (610, 9724)
    assert abs(wl.mean_rating - float(train.targets.mean())) < 1e-6


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_small_file_ids_become_contiguous(tmp_path: Path, newline: str) -> None:
    ratings = read_ratings(write_ratings(tmp_path / "ratings.csv", ROWS, newline=newline))
    # users 3, 10, 42 -> 0, 1, 2; movies 7, 9, 500 -> 0, 1, 2 (in increasing id order)
    assert ratings.users.tolist() == [1, 1, 0, 2, 0]
    assert ratings.items.tolist() == [2, 0, 2, 1, 0]
    assert ratings.ratings.tolist() == [4.0, 3.5, 1.0, 5.0, 0.5]
    assert (ratings.num_users, ratings.num_items) == (3, 3)


def test_columns_may_come_in_any_order(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_text("rating,movieId,userId\n4.5,1,2\n")
    ratings = read_ratings(tmp_path / "ratings.csv")
    assert ratings.ratings.tolist() == [4.5]


def _rows(n: int) -> list[tuple[int, int, float]]:
    return [(i % 17, i % 23, 0.5 + (i % 10) / 2) for i in range(n)]


def test_split_is_seeded_and_disjoint(tmp_path: Path) -> None:
    write_ratings(tmp_path / "ratings.csv", _rows(200))
    a_train, a_test = get_workload("movielens").datasets(data_dir=tmp_path, seed=3)
    b_train, b_test = get_workload("movielens").datasets(data_dir=tmp_path, seed=3)
    c_train, _ = get_workload("movielens").datasets(data_dir=tmp_path, seed=4)
    assert (len(a_train), len(a_test)) == (160, 40)
    for x, y in zip(a_train.features + (a_train.targets,), b_train.features + (b_train.targets,)):
        assert torch.equal(x, y)
    assert torch.equal(a_test.targets, b_test.targets)
    assert not torch.equal(a_train.features[0], c_train.features[0])
    # every rating lands in exactly one split
    pairs = lambda ds: {(int(u), int(m), float(r)) for u, m, r in zip(*ds.features, ds.targets)}  # noqa: E731
    everything = pairs(a_train) | pairs(a_test)
    assert len(everything) == len(pairs(a_train)) + len(pairs(a_test))


def test_test_fraction(tmp_path: Path) -> None:
    write_ratings(tmp_path / "ratings.csv", _rows(100))
    train, test = MovieLensWorkload(test_fraction=0.1).datasets(data_dir=tmp_path)
    assert (len(train), len(test)) == (90, 10)
    with pytest.raises(ValueError, match="test_fraction=1.5"):
        MovieLensWorkload(test_fraction=1.5).datasets(data_dir=tmp_path)


def test_model_is_sized_by_the_data(tmp_path: Path) -> None:
    write_ratings(tmp_path / "ratings.csv", ROWS)
    wl = get_workload("movielens")
    train, _ = wl.datasets(data_dir=tmp_path, seed=0)
    for arch in ("mf", "ncf"):
        model = wl.model(arch)
        out = model(*train.features)
        assert out.shape == (len(train),)
        assert model.user_bias.num_embeddings == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("user,movie,stars\n1,2,3\n", "lacks one of"),
        ("", "lacks one of"),
        ("userId,movieId,rating\n", "holds no ratings"),
        ("userId,movieId,rating\n1,2,good\n", "not a number"),
        ("userId,movieId,rating\n1,2\n", "fewer columns"),
        ("userId,movieId,rating\n1,2,nan\n", "not finite"),
    ],
)
def test_wrong_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "ratings.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=message) as info:
        read_ratings(path)
    assert str(path) in str(info.value)
    assert "HINT:" in str(info.value)


def test_binary_file(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_bytes(b"\x1f\x8b\x08\xff\xfe")
    with pytest.raises(DataError, match="not a text CSV"):
        read_ratings(tmp_path / "ratings.csv")


def test_download_the_zip_with_its_published_md5(tmp_path: Path, isolated_cache: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        csv_text = "userId,movieId,rating,timestamp\r\n1,1,4.0,1\r\n2,1,3.0,1\r\n"
        zf.writestr("ml-latest-small/ratings.csv", csv_text)
        zf.writestr("ml-latest-small/README.txt", "terms")
        zf.writestr("../evil.csv", "outside")
    (mirror / "ml-latest-small.zip").write_bytes(buffer.getvalue())
    (mirror / "ml-latest-small.zip.md5").write_text(md5sum(mirror / "ml-latest-small.zip") + "\n")
    with serve_folder(mirror) as url:
        wl = MovieLensWorkload(mirrors=(url,), test_fraction=0.5)
        train, test = wl.datasets(download=True)
    assert len(train) + len(test) == 2
    assert wl.source is not None
    assert wl.source.kind == "download"
    unpacked = sorted(p.name for p in wl.source.folder.iterdir() if not p.name.startswith("."))
    assert unpacked == ["README.txt", "ratings.csv"]
    assert not (tmp_path / "evil.csv").exists()
    assert not (isolated_cache / "evil.csv").exists()


def test_download_with_a_wrong_md5(tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "ml-latest-small.zip").write_bytes(b"PK not really")
    with serve_folder(mirror) as url, pytest.raises(DataError, match="has md5"):
        MovieLensWorkload(mirrors=(url,), md5="0" * 32).datasets(download=True)


def test_a_byte_order_mark_is_not_part_of_the_header(tmp_path: Path) -> None:
    (tmp_path / "ratings.csv").write_bytes("\ufeffuserId,movieId,rating\n1,2,3.0\n".encode())
    assert read_ratings(tmp_path / "ratings.csv").ratings.tolist() == [3.0]
