"""examples/horovod_cifar10_resnet.py on CIFAR-10 batches in the real pickle layout: it trains (fp16
allreduce, two batches per allreduce, warm-up), writes a checkpoint per epoch from rank 0 and
resumes from the newest one."""

import re

import pytest
import torch

from tests.examples.cifar_batches import write_cifar10
from tests.examples.launch import EXAMPLES, explain, run_example, unprefixed

# ResNet-18 is heavy for a shared CPU: 80 images, sub-batches of 8, two per allreduce, so each worker
# takes 3 optimizer steps per epoch; a low rate keeps BatchNorm on 8 images stable.
COMMON = ["--data-dir", "data", "--batch-size", "8", "--batches-per-allreduce", "2", "--fp16-allreduce",
          "--base-lr", "0.005", "--warmup-epochs", "1", "--log-dir", "logs",
          "--checkpoint-format", "ckpt/checkpoint-{epoch}.pth.tar"]


def _train_losses(text: str) -> dict[int, float]:
    return {int(e): float(x) for e, x in re.findall(r"^epoch (\d+) train: loss ([\d.]+)", text, flags=re.M)}


@pytest.mark.slow
def test_trains_checkpoints_and_resumes(tmp_path) -> None:
    write_cifar10(tmp_path / "data", per_batch=16, test_size=32)

    first = run_example("horovod_cifar10_resnet.py", [*COMMON, "--epochs", "1"], cwd=tmp_path)
    assert first.returncode == 0, explain(first)
    losses = _train_losses(unprefixed(first.stdout))
    assert sorted(losses) == [1], explain(first)
    assert "2 workers, global batch 32, 80 training images, epochs 1..1" in first.stdout, explain(first)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["checkpoint-1.pth.tar"]
    checkpoint = torch.load(tmp_path / "ckpt" / "checkpoint-1.pth.tar")
    assert checkpoint["epoch"] == 1
    assert set(checkpoint) == {"model", "optimizer", "epoch"}
    assert checkpoint["optimizer"]["state"], "the checkpoint lacks the SGD momentum buffers"
    assert list((tmp_path / "logs").glob("events.out.tfevents.*")), "rank 0 wrote no TensorBoard events"

    second = run_example("horovod_cifar10_resnet.py", [*COMMON, "--epochs", "2", "--resume"], cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    assert "resumed from checkpoint of epoch 1" in second.stdout, explain(second)
    assert "epochs 2..2" in second.stdout, explain(second)
    resumed = _train_losses(unprefixed(second.stdout))
    assert sorted(resumed) == [2], explain(second)
    # The second epoch goes on from the trained weights: its loss is well below the first epoch's.
    assert resumed[2] < 0.8 * losses[1], (losses, resumed)
    written = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert written == ["checkpoint-1.pth.tar", "checkpoint-2.pth.tar"]


@pytest.mark.slow
def test_a_fresh_clone_trains_on_synthetic_images_and_says_so(tmp_path) -> None:
    # no CIFAR-10 anywhere: an empty cache, no --data-dir (the README's line, on fewer images)
    args = ["--epochs", "1", "--subset", "64", "--batch-size", "8", "--log-dir", "logs",
            "--checkpoint-format", "ckpt-{epoch}.pth.tar"]
    result = run_example("horovod_cifar10_resnet.py", args, cwd=tmp_path,
                         env={"RINGTRAIN_DATA": str(tmp_path)})
    assert result.returncode == 0, explain(result)
    out = unprefixed(result.stdout)
    assert out.count("no CIFAR-10 in ringtrain's cache: training on synthetic CIFAR-shaped images") == 1, \
        explain(result)
    assert "2 workers, global batch 16, 64 training images, epochs 1..1" in out, explain(result)
    assert sorted(_train_losses(out)) == [1], explain(result)
    assert (tmp_path / "ckpt-1.pth.tar").is_file()


def test_a_missing_data_dir_is_one_line_not_a_traceback(tmp_path, monkeypatch) -> None:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("example_cifar", EXAMPLES / "horovod_cifar10_resnet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["x", "--data-dir", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit) as info:
        module.images(module.parse_args())
    assert str(info.value.code).startswith("error: ")
    assert str(tmp_path / "nowhere") in str(info.value.code)
    assert "HINT" in str(info.value.code)
