"""``ringtrain train`` refuses before any rank starts: no GPU for --device cuda, another workload's data,
a timeline rank 0 cannot write; and warns once when ranks x threads exceed the cores."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch

import ringtrain.train.job as job_module
from ringtrain.cli import train_checks
from ringtrain.cli.main import main
from ringtrain.cli.train_checks import data_folder_problem, mean_brightness
from ringtrain.workloads.mnist import EMBEDDED_MNIST, FASHION_MNIST, MNIST

NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")


def write_idx_folder(folder: Path, brightness: float, items: int = 20, gz: bool = True) -> Path:
    """Four MNIST-format files whose images all have the given mean brightness (0..1)."""
    folder.mkdir(parents=True, exist_ok=True)
    value = round(brightness * 255)
    images = (0x803).to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in (items, 28, 28)) \
        + bytes([value]) * (items * 28 * 28)
    labels = (0x801).to_bytes(4, "big") + items.to_bytes(4, "big") + bytes(i % 10 for i in range(items))
    for name in NAMES:
        body = images if "images" in name else labels
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(body))
        else:
            (folder / name).write_bytes(body)
    return folder


@pytest.fixture
def no_ranks(monkeypatch):
    """Fail the test if training is launched: the checks must answer first."""
    def launched(job):
        raise AssertionError("a rank was started")
    monkeypatch.setattr(job_module, "launch_job", launched)


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_fashion_mnist_data_is_refused_for_mnist(tmp_path, no_ranks, capsys):
    folder = write_idx_folder(tmp_path / "fashion", FASHION_MNIST.mean, gz=False)
    code, err = run_cli(["train", "mnist", "-np", "2", "--data-dir", str(folder)], capsys)
    assert code == 2
    assert err.startswith(f"ringtrain train: error: --data-dir {folder} holds fashion-mnist images, not "
                          "mnist")
    assert f"HINT: train them with `ringtrain train fashion-mnist --data-dir {folder}`" in err
    assert "Traceback" not in err


def test_mnist_data_is_refused_for_fashion_mnist(tmp_path, no_ranks, capsys):
    folder = write_idx_folder(tmp_path / "digits", MNIST.mean)
    code, err = run_cli(["train", "fashion-mnist", "--data-dir", str(folder)], capsys)
    assert code == 2
    assert "holds mnist images, not fashion-mnist" in err


def test_the_embedded_mnist_is_mnist():
    assert abs(mean_brightness(EMBEDDED_MNIST) - MNIST.mean) < 0.01
    assert data_folder_problem("mnist", str(EMBEDDED_MNIST)) is None


@pytest.mark.parametrize("brightness", [MNIST.mean, 0.19])  # 0.19: another digit set (KMNIST-like)
def test_images_that_are_not_fashion_mnist_pass_for_mnist(brightness, tmp_path):
    assert data_folder_problem("mnist", str(write_idx_folder(tmp_path / "d", brightness))) is None


def test_the_right_data_below_a_parent_folder_is_found(tmp_path):
    write_idx_folder(tmp_path / "mnist", MNIST.mean)
    write_idx_folder(tmp_path / "fashion-mnist", FASHION_MNIST.mean)
    assert data_folder_problem("mnist", str(tmp_path)) is None
    assert data_folder_problem("fashion-mnist", str(tmp_path)) is None


def test_another_workloads_files_are_named(tmp_path, no_ranks, capsys):
    (tmp_path / "ml-latest-small").mkdir()
    (tmp_path / "ml-latest-small" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4.0,0\n")
    code, err = run_cli(["train", "mnist", "--data-dir", str(tmp_path)], capsys)
    assert code == 2
    assert f"--data-dir {tmp_path} holds the movielens files" in err
    assert "not the mnist files" in err


def test_missing_files_are_reported_before_any_rank(tmp_path, no_ranks, capsys):
    code, err = run_cli(["train", "mnist", "-np", "2", "--data-dir", str(tmp_path)], capsys)
    assert code == 2
    assert err.startswith(f"ringtrain train: error: data_dir {tmp_path} does not hold the mnist files")
    assert "HINT:" in err


def test_unreadable_images_are_left_to_the_ranks(tmp_path):
    for name in NAMES:
        (tmp_path / f"{name}.gz").write_bytes(b"not gzip")
    assert mean_brightness(tmp_path) is None
    assert data_folder_problem("mnist", str(tmp_path)) is None


@pytest.mark.parametrize("argv", [["train", "mnist", "--device", "cuda"],
                                  ["train", "mnist", "-np", "2", "--device", "cuda"]])
def test_cuda_without_a_gpu_is_refused_before_any_rank(argv, monkeypatch, no_ranks, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = run_cli(argv, capsys)
    assert code == 2
    assert err.startswith("ringtrain train: error: --device cuda: no CUDA device here")
    assert "HINT: use --device cpu" in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_a_timeline_rank_0_cannot_write_is_refused(monkeypatch, no_ranks, capsys):
    monkeypatch.setenv("HOROVOD_TIMELINE", "/nonexistent/t.json")
    code, err = run_cli(["train", "mnist", "-np", "2", "--strategy", "horovod"], capsys)
    assert code == 2
    assert "HOROVOD_TIMELINE=/nonexistent/t.json: rank 0 could not write the timeline" in err


def test_more_ranks_than_cores_warns_once_and_trains(monkeypatch, capsys):
    monkeypatch.setattr(train_checks, "usable_cores", lambda: 2)
    jobs = []
    monkeypatch.setattr(job_module, "launch_job", lambda job: jobs.append(job) or 0)
    assert main(["train", "mnist", "-np", "3"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1
    assert "3 ranks x 1 thread each = 3 threads on 2 cores" in err
    assert "--oversubscribe (RINGTRAIN_OVERSUBSCRIBE=1) silences this warning" in err
    assert len(jobs) == 1
    assert main(["train", "mnist", "-np", "3", "--oversubscribe"]) == 0
    monkeypatch.setenv("RINGTRAIN_OVERSUBSCRIBE", "1")
    assert main(["train", "mnist", "-np", "3"]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_fashion_mnist_files_are_named_so_for_another_workload(tmp_path):
    folder = write_idx_folder(tmp_path / "f", FASHION_MNIST.mean)
    problem = data_folder_problem("cifar10", str(folder))
    assert problem.startswith(f"--data-dir {folder} holds the fashion-mnist files")
    assert "not the cifar10 files" in problem
