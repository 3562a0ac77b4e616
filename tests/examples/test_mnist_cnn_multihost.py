"""examples/mnist_cnn_multihost.py from a fresh clone: no --data-dir, the MNIST subset embedded in
ringtrain (its runs across hosts are in tests/integration/test_multihost.py and test_failures.py)."""

import importlib.util
import re
from pathlib import Path

import pytest

from tests.examples.launch import EXAMPLES, explain, run_example, unprefixed


@pytest.mark.slow
def test_trains_on_the_embedded_mnist_without_a_data_dir(tmp_path: Path) -> None:
    result = run_example("mnist_cnn_multihost.py", [], env={"RINGTRAIN_DATA": str(tmp_path)})
    assert result.returncode == 0, explain(result)
    out = unprefixed(result.stdout)
    assert sorted(re.findall(r"^rank (\d) of 2 on ", out, flags=re.M)) == ["0", "1"], explain(result)
    final = re.search(r"^final: 32 steps on 2 ranks, test loss [\d.]+, test accuracy ([\d.]+)$", out, re.M)
    assert final, explain(result)
    assert float(final[1]) > 0.2, explain(result)  # chance is 0.1; one short epoch on 2,048 images


def test_a_data_dir_without_the_files_is_one_line(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("example_multihost", EXAMPLES / "mnist_cnn_multihost.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as info:
        module.load(tmp_path, "train", 10)
    assert str(info.value.code).startswith(f"error: {tmp_path}")
    assert "HINT" in str(info.value.code)
