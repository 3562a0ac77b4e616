"""The IDX reader: real files, files written here (plain and gzipped), and every kind of wrong file."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.workloads import DataError
from ringtrain.workloads.idx import read_idx, write_idx


def test_reads_the_real_mnist_test_files(shared_data: Path) -> None:
    images = read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz", expect_ndim=3)
    labels = read_idx(shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz", expect_ndim=1)
    assert images.shape == (10000, 28, 28)
    assert images.dtype == torch.uint8
    assert labels[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert torch.bincount(labels).min() == 892


@pytest.mark.parametrize("name", ["data-idx3-ubyte", "data-idx3-ubyte.gz"])
def test_round_trip_plain_and_gzipped(tmp_path: Path, name: str) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / name, array)
    assert (tmp_path / name).read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"\x00\x00")
    assert read_idx(tmp_path / name).numpy().tolist() == array.tolist()


def test_reads_other_element_types(tmp_path: Path) -> None:
    values = np.array([1.5, -2.0], dtype=">f4")
    (tmp_path / "f").write_bytes(struct.pack(">BBBBI", 0, 0, 0x0D, 1, 2) + values.tobytes())
    assert read_idx(tmp_path / "f").tolist() == [1.5, -2.0]


def test_gzip_output_is_reproducible(tmp_path: Path) -> None:
    array = np.ones((5, 2), dtype=np.uint8)
    write_idx(tmp_path / "a.gz", array)
    write_idx(tmp_path / "b.gz", array)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()


def _expect_error(path: Path, *fragments: str, ndim: int | None = None) -> None:
    with pytest.raises(DataError) as info:
        read_idx(path, expect_ndim=ndim)
    message = str(info.value)
    assert str(path) in message
    assert "HINT:" in message
    for fragment in fragments:
        assert fragment in message


def test_wrong_magic_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(b"<html>not found</html>"))
    _expect_error(path, "not an IDX file")


def test_wrong_number_of_dimensions(tmp_path: Path) -> None:
    write_idx(tmp_path / "labels", np.zeros(4, dtype=np.uint8))
    _expect_error(tmp_path / "labels", "1 dimensions, expected 3", ndim=3)


def test_truncated_data(tmp_path: Path) -> None:
    write_idx(tmp_path / "x", np.zeros((3, 4, 4), dtype=np.uint8))
    raw = (tmp_path / "x").read_bytes()
    (tmp_path / "x").write_bytes(raw[:-5])
    _expect_error(tmp_path / "x", "promises")


def test_trailing_garbage(tmp_path: Path) -> None:
    write_idx(tmp_path / "x", np.zeros((3, 4, 4), dtype=np.uint8))
    (tmp_path / "x").write_bytes((tmp_path / "x").read_bytes() + b"extra")
    _expect_error(tmp_path / "x", "promises")


def test_header_cut_short(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"\x00\x00\x08\x03\x00\x00")
    _expect_error(tmp_path / "x", "header")


def test_damaged_gzip(tmp_path: Path) -> None:
    write_idx(tmp_path / "x.gz", np.zeros((30, 4, 4), dtype=np.uint8))
    raw = (tmp_path / "x.gz").read_bytes()
    (tmp_path / "x.gz").write_bytes(raw[: len(raw) // 2])
    _expect_error(tmp_path / "x.gz", "cannot be decompressed")


def test_missing_file(tmp_path: Path) -> None:
    _expect_error(tmp_path / "absent.gz", "does not exist")
