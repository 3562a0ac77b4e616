"""Fetching a file from a list of mirrors: md5 verified, progress bar, atomic write.

``urllib`` handles ``http(s)://`` and ``file://`` alike, which lets the tests use a local server.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from ringtrain.exceptions import DataError

_CHUNK = 1 << 16


def md5sum(path: str | Path) -> str:
    """The md5 hex digest of a file, read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_one(url: str, dest: Path, md5: str, progress: bool, timeout: float) -> None:
    """Stream ``url`` into a temporary file beside ``dest``; rename it only if the md5 matches."""
    digest = hashlib.md5(usedforsecurity=False)
    # a temporary name in the same folder: the final rename is atomic, so a reader (or another rank
    # downloading the same file) never sees a half-written file
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            total = response.headers.get("Content-Length")
            with tqdm(total=int(total) if total else None, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=dest.name, disable=not progress, leave=False) as bar:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        got = digest.hexdigest()
        if got != md5:
            raise DataError(f"{url} has md5 {got}, expected {md5}. "
                            "HINT: the mirror serves a different or damaged file; try another mirror.")
        os.replace(tmp_name, dest)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


def download(urls: Sequence[str], dest: str | Path, md5: str, *, progress: bool = True,
             timeout: float = 60.0) -> Path:
    """Download the first mirror in ``urls`` that serves a file with this ``md5`` to ``dest``.

    A ``dest`` that already holds the right bytes is kept as it is. Raises DataError listing every
    mirror's failure when none works; ``dest`` is then left untouched.
    """
    dest = Path(dest)
    if dest.is_file() and md5sum(dest) == md5:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    failures = []
    for url in urls:
        try:
            _fetch_one(url, dest, md5, progress, timeout)
            return dest
        except DataError as err:
            failures.append(str(err))
        except (urllib.error.URLError, OSError, ValueError) as err:
            failures.append(f"{url}: {err}")
    tried = "\n  ".join(failures) or "no mirror given"
    raise DataError(f"could not download {dest.name} to {dest.parent}:\n  {tried}\n"
                    f"HINT: check the network, or copy the file to {dest} yourself, "
                    "or pass data_dir= a folder that holds it.")


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    Several ranks of one node may unpack the same archive into a shared cache at once; with a
    rename, none of them ever reads a file another is still writing.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp_name, path)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)


def fetch_text(url: str, timeout: float = 60.0) -> str:
    """A small text file (such as a published ``.md5``) from ``url``; DataError when unreachable."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read(1 << 20).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DataError(f"could not read {url}: {err}. HINT: check the network or pass data_dir=.") from None
