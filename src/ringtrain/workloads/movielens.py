"""MovieLens ratings (``ratings.csv`` of ml-latest-small): (user, item) -> rating regression.

User and movie ids become contiguous indices (in increasing id order, over the whole file), ratings
float targets; a seeded shuffle puts ``test_fraction`` of the ratings in the test split.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ringtrain.exceptions import DataError
from ringtrain.workloads.base import DataPath, Defaults, Workload
from ringtrain.workloads.dataset import TensorPairDataset, check_subset, take_subset
from ringtrain.workloads.download import download as download_file
from ringtrain.workloads.download import fetch_text, write_atomic
from ringtrain.workloads.models.recommender import BiasedMF, NeuralCF
from ringtrain.workloads.sources import DataSource, locate

RATINGS = "ratings.csv"
ARCHIVE = "ml-latest-small.zip"
MIRRORS = ("https://files.grouplens.org/datasets/movielens/",)
LAYOUTS = ("ml-latest-small", "movielens/ml-latest-small")
TEST_FRACTION = 0.2
_COLUMNS = ("userId", "movieId", "rating")


class Ratings:
    """All ratings of a file as aligned arrays, with ids already mapped to contiguous indices."""

    def __init__(self, users: np.ndarray, items: np.ndarray, ratings: np.ndarray, num_users: int,
                 num_items: int) -> None:
        self.users = users
        self.items = items
        self.ratings = ratings
        self.num_users = num_users
        self.num_items = num_items

    def split(self, test_fraction: float, seed: int) -> tuple[TensorPairDataset, TensorPairDataset]:
        """A seeded random split of the ratings into (train, test) datasets."""
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction={test_fraction} must lie strictly between 0 and 1. "
                             "HINT: use e.g. 0.2.")
        order = torch.randperm(len(self.ratings), generator=torch.Generator().manual_seed(seed))
        n_test = int(round(len(order) * test_fraction))
        full = TensorPairDataset(
            (torch.from_numpy(self.users), torch.from_numpy(self.items)), torch.from_numpy(self.ratings))
        return full.select(order[n_test:]), full.select(order[:n_test])


def read_ratings(path: Path) -> Ratings:
    """Parse a MovieLens ``ratings.csv`` (header ``userId,movieId,rating[,timestamp]``, CRLF or LF)."""
    hint = "HINT: use ratings.csv of a MovieLens 'latest' release (columns userId,movieId,rating,timestamp)."
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a BOM is not a column
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None or any(c not in header for c in _COLUMNS):
                raise DataError(f"{path} has header {header}, which lacks one of {list(_COLUMNS)}. {hint}")
            cols = [header.index(c) for c in _COLUMNS]
            rows = [(r[cols[0]], r[cols[1]], r[cols[2]]) for r in reader if r]
    except FileNotFoundError:
        raise DataError(f"{path} does not exist. {hint}") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not a text CSV file ({err}). {hint}") from None
    except IndexError:
        raise DataError(f"{path} has a row with fewer columns than its header. {hint}") from None
    if not rows:
        raise DataError(f"{path} holds no ratings. {hint}")
    try:
        user_ids = np.array([int(r[0]) for r in rows], dtype=np.int64)
        item_ids = np.array([int(r[1]) for r in rows], dtype=np.int64)
        ratings = np.array([float(r[2]) for r in rows], dtype=np.float32)
    except ValueError as err:
        raise DataError(f"{path} has a value that is not a number ({err}). {hint}") from None
    if not np.isfinite(ratings).all():
        raise DataError(f"{path} has a rating that is not finite. {hint}")
    unique_users, users = np.unique(user_ids, return_inverse=True)
    unique_items, items = np.unique(item_ids, return_inverse=True)
    return Ratings(users.astype(np.int64), items.astype(np.int64), ratings, len(unique_users),
                   len(unique_items))


def fetch(folder: Path, mirrors: tuple[str, ...] = MIRRORS, md5: str | None = None,
          progress: bool = True) -> None:
    """Download ``ml-latest-small.zip`` (md5 verified) and unpack its CSV files into ``folder``.

    GroupLens updates this "development" set now and then and publishes the zip's md5 beside it
    (``.zip.md5``), so the md5 is read from the first mirror unless given.
    """
    if md5 is None:
        md5 = fetch_text(mirrors[0] + ARCHIVE + ".md5").split()[0].strip().lower()
    archive = download_file([m + ARCHIVE for m in mirrors], folder.parent / ARCHIVE, md5, progress=progress)
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            name = Path(info.filename).name
            # flatten and keep only the known plain files: no path from the archive reaches the disk
            if name in (RATINGS, "movies.csv", "links.csv", "tags.csv", "README.txt"):
                write_atomic(folder / name, zf.read(info))


class MovieLensWorkload(Workload):
    """Rating prediction on MovieLens ml-latest-small with a biased matrix factorisation."""

    name = "movielens"
    task = "regression"
    description = "MovieLens ml-latest-small ratings, biased matrix factorisation"
    defaults = Defaults(epochs=10, batch_size=256, lr=2e-3, optimizer="adam")
    architectures = {"mf": BiasedMF, "ncf": NeuralCF}

    def __init__(self, mirrors: tuple[str, ...] = MIRRORS, md5: str | None = None,
                 test_fraction: float = TEST_FRACTION) -> None:
        self.mirrors = mirrors
        self.md5 = md5
        self.test_fraction = test_fraction
        self.source: DataSource | None = None
        # sizes of ml-latest-small, replaced by what datasets() reads
        self.num_users = 610
        self.num_items = 9724
        self.mean_rating = 3.5

    def datasets(
        self,
        data_dir: DataPath = None,
        download: bool = False,
        cache_dir: DataPath = None,
        subset: int | None = None,
        seed: int = 0,
    ) -> tuple[TensorPairDataset, TensorPairDataset]:
        check_subset(subset)
        self.source = locate(
            "movielens",
            [(RATINGS,)],
            layouts=LAYOUTS,
            data_dir=data_dir,
            cache_dir=cache_dir,
            download=download,
            fetch=lambda folder: fetch(folder, self.mirrors, self.md5),
        )
        ratings = read_ratings(self.source.file((RATINGS,)))
        train, test = ratings.split(self.test_fraction, seed)
        self.num_users, self.num_items = ratings.num_users, ratings.num_items
        self.mean_rating = float(train.targets.mean())
        return take_subset(train, subset, seed), take_subset(test, subset, seed + 1)

    def _build(self, constructor: Callable[..., nn.Module]) -> nn.Module:
        return constructor(self.num_users, self.num_items, global_mean=self.mean_rating)
