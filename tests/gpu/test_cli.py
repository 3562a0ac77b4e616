"""The commands a GPU user types first, on CPU and on CUDA: ``ringtrain check`` alone and under
``ringtrain run -np 2``, and ``ringtrain train`` (MNIST, and a CIFAR-shaped ResNet-18 with --amp)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.system import clean_env

TIMEOUT = 600


def _ringtrain(*args: str, nproc: int = 1, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``ringtrain ARGS`` with this interpreter, under ``ringtrain run -np N`` when ``nproc`` > 1."""
    argv = [sys.executable, "-m", "ringtrain", *args]
    if nproc > 1:
        argv = [sys.executable, "-m", "ringtrain", "run", "-np", str(nproc), *argv]
    return subprocess.run(argv, env=clean_env({"GLOO_SOCKET_IFNAME": "lo"}), capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize(("device", "nproc"), [
    pytest.param("cpu", 2, id="cpu-2"),
    pytest.param("cuda", 1, id="cuda-1", marks=pytest.mark.cuda),
    pytest.param("cuda", 2, id="cuda-2", marks=pytest.mark.cuda),
])
def test_check_passes_on_the_device(device: str, nproc: int) -> None:
    result = _ringtrain("check", "--device", device, "--sizes", "4K,1M", "--iterations", "2", nproc=nproc)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"all checks passed on {nproc} rank(s)" in output
    for rank in range(nproc):
        assert f"hello from rank {rank} of {nproc} " in output
    hellos = [line for line in output.splitlines() if line.startswith("hello from rank")]
    if device == "cuda":
        # pinned by local rank: cuda:local_rank % GPUs
        assert all(", device cuda:" in line for line in hellos), hellos
        assert "gpus: 0: " in output
    else:
        assert all(line.endswith("device cpu)") for line in hellos), hellos


@pytest.mark.slow
@pytest.mark.parametrize(("device", "nproc", "extra"), [
    pytest.param("cpu", 2, ["--strategy", "horovod", "--amp"], id="cpu-2-horovod-amp"),
    pytest.param("cuda", 1, [], id="cuda-1", marks=pytest.mark.cuda),
    pytest.param("cuda", 2, [], id="cuda-2-ddp", marks=pytest.mark.cuda),
    pytest.param("cuda", 2, ["--strategy", "horovod", "--amp", "--fp16-allreduce"], id="cuda-2-horovod-amp",
                 marks=pytest.mark.cuda),
])
def test_train_mnist_on_the_device(device: str, nproc: int, extra: list[str], tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    # bf16 autocast is slow on a CPU: there, half the digits (the bar below holds on either)
    subset = "1000" if device == "cpu" else "2000"
    result = _ringtrain("train", "mnist", "-np", str(nproc), "--device", device, "--subset", subset,
                        "--epochs", "2", "--no-progress", "--threads", "1", "--results-json", str(results),
                        *extra)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"device {device}" in output
    epochs = json.loads(results.read_text())
    rows = epochs["epochs"] if isinstance(epochs, dict) else epochs
    assert len(rows) == 2
    assert all(math.isfinite(row["train_loss"]) for row in rows)
    assert rows[-1]["accuracy"] > 0.5  # 1,000-2,000 MNIST digits, 2 epochs: far above chance (0.1)


@pytest.mark.slow
@pytest.mark.parametrize(("device", "amp"), [
    pytest.param("cpu", [], id="cpu"),  # bf16 autocast is slow on most CPUs: the GPU run has --amp
    pytest.param("cuda", ["--amp"], id="cuda-amp", marks=pytest.mark.cuda),
])
def test_train_a_cifar_shaped_resnet18(device: str, amp: list[str], tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    result = _ringtrain("train", "synthetic", "--arch", "resnet18", "--device", device, "--subset", "64",
                        "--batch-size", "16", "--epochs", "1", "--max-steps-per-epoch", "3", "--no-progress",
                        "--threads", "2", "--results-json", str(results), *amp)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"device {device}" in output
    epochs = json.loads(results.read_text())
    rows = epochs["epochs"] if isinstance(epochs, dict) else epochs
    assert math.isfinite(rows[-1]["train_loss"])
