"""Downloads from a local HTTP server and file:// URLs: md5 checks, mirror fallback, atomic writes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ringtrain.workloads import DataError
from ringtrain.workloads.download import download, fetch_text, md5sum, write_atomic
from ringtrain.workloads.mnist import EMBEDDED_MNIST
from tests.workloads.helpers import serve_folder

PAYLOAD = EMBEDDED_MNIST / "t10k-images-idx3-ubyte.gz"  # a real 300 kB file to serve


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_md5sum(tmp_path: Path) -> None:
    assert md5sum(PAYLOAD) == _md5(PAYLOAD)


def test_download_from_a_local_http_server(tmp_path: Path) -> None:
    dest = tmp_path / "out" / "file.gz"
    with serve_folder(EMBEDDED_MNIST) as url:
        got = download([url + PAYLOAD.name], dest, _md5(PAYLOAD), progress=False)
    assert got == dest
    assert dest.read_bytes() == PAYLOAD.read_bytes()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["file.gz"]  # no temporary file left


def test_progress_bar_shows_the_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serve_folder(EMBEDDED_MNIST) as url:
        download([url + PAYLOAD.name], tmp_path / "x.gz", _md5(PAYLOAD), progress=True)
    assert "x.gz" in capsys.readouterr().err


def test_file_url(tmp_path: Path) -> None:
    dest = download([PAYLOAD.as_uri()], tmp_path / "x.gz", _md5(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD.read_bytes()


def test_wrong_md5_keeps_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "x.gz"
    with serve_folder(EMBEDDED_MNIST) as url, pytest.raises(DataError) as info:
        download([url + PAYLOAD.name], dest, "0" * 32, progress=False)
    message = str(info.value)
    assert _md5(PAYLOAD) in message
    assert "0" * 32 in message
    assert "HINT:" in message
    assert list(tmp_path.iterdir()) == []


def test_a_bad_file_in_place_is_replaced_atomically(tmp_path: Path) -> None:
    dest = tmp_path / "x.gz"
    dest.write_bytes(b"half a download")
    download([PAYLOAD.as_uri()], dest, _md5(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD.read_bytes()


def test_a_wrong_download_leaves_the_old_file_alone(tmp_path: Path) -> None:
    dest = tmp_path / "x.gz"
    dest.write_bytes(b"the user's own file")
    with pytest.raises(DataError):
        download([PAYLOAD.as_uri()], dest, "1" * 32, progress=False)
    assert dest.read_bytes() == b"the user's own file"


def test_mirrors_are_tried_in_order(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / PAYLOAD.name).write_bytes(b"a different file")
    with serve_folder(tmp_path / "wrong") as bad, serve_folder(EMBEDDED_MNIST) as good:
        urls = [bad + "missing.gz", bad + PAYLOAD.name, good + PAYLOAD.name]
        dest = download(urls, tmp_path / "out" / "x.gz", _md5(PAYLOAD), progress=False)
    assert dest.read_bytes() == PAYLOAD.read_bytes()


def test_every_failure_is_reported(tmp_path: Path) -> None:
    with serve_folder(tmp_path) as url, pytest.raises(DataError) as info:
        download([url + "a.gz", "http://127.0.0.1:9/b.gz"], tmp_path / "x.gz", "0" * 32, progress=False,
                 timeout=10)
    message = str(info.value)
    assert "a.gz" in message
    assert "b.gz" in message
    assert "404" in message


def test_a_file_already_right_is_not_downloaded_again(tmp_path: Path) -> None:
    dest = tmp_path / "x.gz"
    dest.write_bytes(PAYLOAD.read_bytes())
    # no mirror at all: it must not be needed
    assert download([], dest, _md5(PAYLOAD), progress=False) == dest


def test_fetch_text(tmp_path: Path) -> None:
    (tmp_path / "f.md5").write_text("abc123  f.zip\n")
    with serve_folder(tmp_path) as url:
        assert fetch_text(url + "f.md5").split()[0] == "abc123"
        with pytest.raises(DataError, match="could not read"):
            fetch_text(url + "absent.md5")


def test_write_atomic_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_atomic(tmp_path / "a", b"one")
    write_atomic(tmp_path / "a", b"two")
    assert (tmp_path / "a").read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
