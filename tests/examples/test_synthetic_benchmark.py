"""examples/synthetic_benchmark.py: timed rounds after warm-up, per-device and total img/sec."""

import re
import subprocess
import sys

import pytest

from tests.examples.launch import EXAMPLES, explain, run_example, unprefixed


@pytest.mark.slow
def test_reports_throughput() -> None:
    # ResNet-18 (the default) runs in the CIFAR-10 example's test; a small model keeps this one fast.
    model = "mnist-cnn"
    args = ["--model", model, "--batch-size", "4", "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
            "--num-iters", "3", "--fp16-allreduce"]
    result = run_example("synthetic_benchmark.py", args)
    assert result.returncode == 0, explain(result)
    out = unprefixed(result.stdout)
    assert f"Model: {model}" in out, explain(result)
    assert "Number of CPUs: 2" in out, explain(result)
    # warm-up comes before any timed round, and there are exactly --num-iters rounds
    assert out.index("Running warmup...") < out.index("Running benchmark...") < out.index("Iter #0")
    rounds = [float(x) for x in re.findall(r"^Iter #\d: ([\d.]+) img/sec per CPU$", out, flags=re.M)]
    assert len(rounds) == 3, explain(result)
    per_device = re.search(r"^Img/sec per CPU: ([\d.]+) \+-([\d.]+)$", out, flags=re.M)
    total = re.search(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) \+-([\d.]+)$", out, flags=re.M)
    assert per_device, explain(result)
    assert total, explain(result)
    # both printed to one decimal: they may differ by two roundings
    assert float(per_device[1]) == pytest.approx(sum(rounds) / 3, abs=0.15)
    assert float(total[1]) == pytest.approx(2 * float(per_device[1]), abs=0.2)


def test_unknown_model_is_a_usage_error() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / "synthetic_benchmark.py"), "--model", "resnet50"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "invalid choice: 'resnet50'" in result.stderr
    assert "resnet18" in result.stderr
