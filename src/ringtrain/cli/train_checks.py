"""What ``ringtrain train`` checks before it starts a rank: device, data folder, timeline, cores.

Each rank would find a missing GPU or the wrong data for itself, after the rendezvous, once per rank,
with a traceback; here it is found once, in the launcher, and said in one line (exit code 2). The data
folder check knows each workload's files and, for the two data sets that share MNIST's file names
(MNIST and Fashion-MNIST), tells them apart by their images' mean brightness, which the workloads
already record for normalisation (0.131 and 0.286: far apart, and stable over any subset).
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ringtrain.env.cores import usable_cores
from ringtrain.exceptions import UsageError
from ringtrain.launch.prechecks import (
    OVERSUBSCRIBE_VARIABLE,
    TIMELINE,
    check_device,
    oversubscription_warning,
    timeline_problem,
)

if TYPE_CHECKING:
    from ringtrain.train.job import TrainJob

#: Images read to measure a file's brightness: enough to be stable (1,000 images, 784 KB), quick to read.
SAMPLE_IMAGES = 1000
#: A folder whose brightness lies this far from its own workload's and nearer another's holds the other.
BRIGHTNESS_MARGIN = 0.05


def before_training(job: TrainJob, oversubscribe: bool = False) -> list[str]:
    """Check ``job`` before any rank starts; raise UsageError for what would fail, return warnings.

    With ``--ray`` the ranks run on the Ray nodes: this machine's devices and cores say nothing of theirs.
    """
    if job.ray is None:
        check_device(job.trainer.device)
    problem = data_folder_problem(job.workload, job.data_dir)
    if problem is not None:
        raise UsageError(problem)
    # rank 0 writes a timeline only through the Horovod API (--strategy horovod), and runs here
    if job.trainer.strategy == "horovod" and TIMELINE in os.environ and not job.host_discovery_script:
        problem = timeline_problem(os.environ[TIMELINE], f"{TIMELINE}={os.environ[TIMELINE]}")
        if problem is not None:
            raise UsageError(problem)
    warnings = []
    if not oversubscribe and not job.host_discovery_script and job.ray is None:
        cores = usable_cores()
        threads = job.trainer.threads or max(1, cores // job.nproc)  # the Trainer's own default
        warning = oversubscription_warning(job.nproc, threads, cores,
                                           f"--oversubscribe ({OVERSUBSCRIBE_VARIABLE}=1)")
        if warning:
            warnings.append(warning)
    return warnings


def check_before_training(job: TrainJob, oversubscribe: bool = False) -> None:
    """:func:`before_training`, its warnings printed to stderr once."""
    for warning in before_training(job, oversubscribe):
        print(f"ringtrain train: warning: {warning}", file=sys.stderr, flush=True)


def _file_tables() -> dict[str, tuple[list[tuple[str, ...]], tuple[str, ...]]]:
    """Workload -> (files it needs, each as its alternative names; sub-folders searched below a data
    folder), as the workloads look for them."""
    from ringtrain.workloads import cifar, movielens
    from ringtrain.workloads.mnist import FASHION_MNIST, MNIST, SPLIT_FILES

    idx: list[tuple[str, ...]] = [(f"{name}.gz", name) for pair in SPLIT_FILES.values() for name in pair]
    return {
        "mnist": (idx, MNIST.layouts),
        "fashion-mnist": (idx, FASHION_MNIST.layouts),
        "cifar10": ([(name,) for name in (*cifar.TRAIN_BATCHES, cifar.TEST_BATCH)], cifar.LAYOUTS),
        "movielens": ([(movielens.RATINGS,)], movielens.LAYOUTS),
    }


def data_folder_problem(workload: str, data_dir: str | None) -> str | None:
    """Why ``data_dir`` cannot serve ``workload``: its files are missing, or it holds another
    workload's data. None when it serves, or when there is nothing to check."""
    if data_dir is None or not Path(data_dir).expanduser().is_dir():
        return None  # no folder given; a missing one is refused by the job itself
    from ringtrain.exceptions import DataError
    from ringtrain.workloads.sources import locate

    tables = _file_tables()
    if workload not in tables:
        return None
    found: dict[str, Path] = {}
    missing = ""
    for name, (requirements, layouts) in tables.items():
        try:
            found[name] = locate(name, requirements, layouts=layouts, data_dir=data_dir, cache_dir=None,
                                 download=False, fetch=None).folder
        except DataError as exc:
            if name == workload:
                missing = str(exc)
    if workload in found:
        return _lookalike_problem(workload, found[workload], data_dir)
    others = [name for name in found if name != workload]
    if others:
        other = others[0]
        if other in _IDX_SETS:  # MNIST's file names fit both: the images tell which it is
            other = _which_idx_set(found[other]) or other
        return (f"--data-dir {data_dir} holds the {other} files ({found[others[0]]}), not the {workload} "
                f"files. HINT: train that with `ringtrain train {other} --data-dir {data_dir}`, or give "
                f"--data-dir the folder that holds the {workload} files.")
    return missing or None


#: The workloads whose files share MNIST's names and headers.
_IDX_SETS = ("mnist", "fashion-mnist")


def _which_idx_set(folder: Path) -> str | None:
    """MNIST or Fashion-MNIST, whichever the images of ``folder`` look like (None if unreadable)."""
    from ringtrain.workloads.mnist import FASHION_MNIST, MNIST

    brightness = mean_brightness(folder)
    if brightness is None:
        return None
    return min((MNIST, FASHION_MNIST), key=lambda spec: abs(spec.mean - brightness)).name


def _lookalike_problem(workload: str, folder: Path, data_dir: str) -> str | None:
    """For MNIST and Fashion-MNIST (same file names, same headers): the data set the images look like,
    when it is the other one."""
    from ringtrain.workloads.mnist import FASHION_MNIST, MNIST

    specs = {spec.name: spec for spec in (MNIST, FASHION_MNIST)}
    if workload not in specs:
        return None
    brightness = mean_brightness(folder)
    if brightness is None:
        return None  # unreadable: the ranks report that with the file's name
    nearest = specs[_which_idx_set(folder) or workload]
    own = specs[workload]
    if nearest is own or abs(own.mean - brightness) < BRIGHTNESS_MARGIN:
        return None
    return (f"--data-dir {data_dir} holds {nearest.name} images, not {workload}: the files have the same "
            f"names, but the images' mean brightness is {brightness:.3f}, {nearest.name}'s is "
            f"{nearest.mean:.3f} and {workload}'s {own.mean:.3f}. HINT: train them with `ringtrain train "
            f"{nearest.name} --data-dir {data_dir}`, or give --data-dir the folder that holds the {workload} "
            "files.")


def mean_brightness(folder: Path) -> float | None:
    """Mean pixel value (0..1) of the first training images of an IDX folder; None if unreadable."""
    for name, opener in (("train-images-idx3-ubyte.gz", gzip.open), ("train-images-idx3-ubyte", open)):
        path = folder / name
        if not path.is_file():
            continue
        try:
            with opener(path, "rb") as handle:
                header = handle.read(16)
                if len(header) < 16 or header[:4] != b"\x00\x00\x08\x03":
                    return None  # not an IDX file of uint8 images
                rows, cols = int.from_bytes(header[8:12], "big"), int.from_bytes(header[12:16], "big")
                pixels = handle.read(SAMPLE_IMAGES * rows * cols)
        except (OSError, EOFError, gzip.BadGzipFile):
            return None
        return sum(pixels) / len(pixels) / 255 if pixels else None
    return None
