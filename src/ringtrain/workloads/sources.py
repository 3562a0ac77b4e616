"""Where a dataset's files come from, in a fixed order.

1. ``data_dir``, when given (a missing folder or missing files is an error, never a fallback);
2. the cache folder: ``cache_dir``, else ``$RINGTRAIN_DATA``, else ``~/.cache/ringtrain``;
3. a download into the cache, only when ``download=True``;
4. the copy embedded in the package, for the datasets that have one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # not on Windows: downloads there are only atomic, not deduplicated
    fcntl = None  # type: ignore[assignment]  # mypy types the name as the module, never None

from ringtrain.exceptions import DataError

CACHE_ENV = "RINGTRAIN_DATA"
"""Environment variable naming the cache folder."""

Requirement = tuple[str, ...]
"""File names of which one must exist (e.g. the gzipped and the plain name of one file)."""


@dataclass(frozen=True)
class DataSource:
    """A folder that holds a whole dataset, and how it was found."""

    kind: str
    """One of ``data_dir``, ``cache``, ``download``, ``embedded``."""
    folder: Path

    def file(self, requirement: Requirement) -> Path:
        """The first existing alternative of ``requirement`` in the folder."""
        for name in requirement:
            if (self.folder / name).is_file():
                return self.folder / name
        raise DataError(f"none of {list(requirement)} is in {self.folder}. HINT: copy the file there.")

    def describe(self) -> str:
        """A short human phrase, e.g. for a log line."""
        return f"{self.kind} {self.folder}"


def cache_root(cache_dir: str | Path | None = None, environ: dict[str, str] | None = None) -> Path:
    """The cache folder: the argument, else ``$RINGTRAIN_DATA``, else ``~/.cache/ringtrain``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    return Path.home() / ".cache" / "ringtrain"


def _missing(folder: Path, requirements: Sequence[Requirement]) -> list[str]:
    """The first name of every requirement that ``folder`` does not satisfy."""
    return [req[0] for req in requirements if not any((folder / n).is_file() for n in req)]


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """Hold a lock file in ``folder``: the ranks of one node download a dataset once, not once each."""
    if fcntl is None:
        yield
        return
    with open(folder / ".download.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _holds(folder: Path, requirements: Sequence[Requirement]) -> bool:
    return folder.is_dir() and not _missing(folder, requirements)


def _candidates(root: Path, layouts: Sequence[str]) -> list[Path]:
    """``root`` itself, then each known sub-folder layout below it."""
    return [root] + [root / layout for layout in layouts]


def locate(
    dataset: str,
    requirements: Sequence[Requirement],
    *,
    layouts: Sequence[str],
    data_dir: str | Path | None,
    cache_dir: str | Path | None,
    download: bool,
    fetch: Callable[[Path], None] | None,
    embedded: Path | None = None,
) -> DataSource:
    """Find the folder holding every required file, trying the sources in the documented order.

    ``layouts`` are sub-folders tried below ``data_dir`` and the cache (the first one is where
    downloads go); ``fetch(folder)`` downloads the dataset into ``folder``.
    """
    wanted = ", ".join(req[0] for req in requirements)
    if data_dir is not None:
        root = Path(data_dir).expanduser()
        if not root.is_dir():
            raise DataError(f"data_dir {root} for {dataset} does not exist or is not a folder. "
                            f"HINT: pass (data_dir= or --data-dir) the folder that holds {wanted}, or "
                            "leave it unset to use the cache / download / embedded copy.")
        for folder in _candidates(root, layouts):
            if _holds(folder, requirements):
                return DataSource("data_dir", folder)
        # name what is missing in the folder that came closest, e.g. one file of four
        closest = min(_candidates(root, layouts), key=lambda f: len(_missing(f, requirements)))
        missing = ", ".join(_missing(closest, requirements))
        looked = ", ".join(str(f) for f in _candidates(root, layouts))
        raise DataError(f"data_dir {root} does not hold the {dataset} files (looked in {looked}); "
                        f"{closest} lacks {missing}. HINT: copy the files into {closest}, or point "
                        "data_dir (--data-dir) to the folder that has them.")
    cache = cache_root(cache_dir)
    for folder in _candidates(cache, layouts):
        if _holds(folder, requirements):
            return DataSource("cache", folder)
    if download and fetch is not None:
        target = cache / layouts[0]
        target.mkdir(parents=True, exist_ok=True)
        with _exclusive(target):
            # another rank may have finished the download while this one waited for the lock
            if not _holds(target, requirements):
                fetch(target)
        if _holds(target, requirements):
            return DataSource("download", target)
        raise DataError(f"the download of {dataset} into {target} did not produce {wanted}. "
                        f"HINT: delete {target} and try again, or pass data_dir (--data-dir).")
    if embedded is not None and _holds(embedded, requirements):
        return DataSource("embedded", embedded)
    how = "fetch it with download=True (--download), or " if fetch is not None else ""
    raise DataError(f"no {dataset} data in the cache {cache} (looked for {wanted}). "
                    f"HINT: {how}pass data_dir (--data-dir) a folder holding the files, or copy them "
                    f"into {cache / layouts[0]} (or set ${CACHE_ENV} to a folder that has them).")
