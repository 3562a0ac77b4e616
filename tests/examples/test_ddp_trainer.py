"""examples/ddp_trainer.py under torchrun: the tutorial's job on ringtrain's Trainer learns MNIST,
snapshots every epoch, and a longer re-run resumes from the newest snapshot."""

import re

import pytest

from tests.examples.launch import explain, run_example

ARGS = ["1", "--subset", "1000", "--snapshot-dir", "snaps"]


def _epochs(text: str) -> dict[int, tuple[float, float]]:
    """epoch -> (train loss, accuracy in %) from the Trainer's epoch lines."""
    rows = re.findall(r"^epoch (\d+)/\d+ .*train loss ([\d.]+) .*accuracy ([\d.]+)%", text, flags=re.M)
    return {int(e): (float(loss), float(acc)) for e, loss, acc in rows}


@pytest.mark.slow
def test_learns_snapshots_and_resumes(tmp_path) -> None:
    first = run_example("ddp_trainer.py", ["2", *ARGS], launcher="torchrun", cwd=tmp_path)
    assert first.returncode == 0, explain(first)
    assert "2 rank(s), strategy ddp" in first.stdout, explain(first)
    epochs = _epochs(first.stdout)
    assert sorted(epochs) == [1, 2], explain(first)
    assert epochs[2][0] < epochs[1][0], explain(first)
    assert epochs[2][1] > 70.0, explain(first)  # chance is 10%
    snapshots = sorted(p.name for p in (tmp_path / "snaps").glob("*.pt"))
    assert len(snapshots) == 2, snapshots
    assert all(re.fullmatch(r"snapshot-\d{9}\.pt", name) for name in snapshots), snapshots

    second = run_example("ddp_trainer.py", ["3", *ARGS], launcher="torchrun", cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    assert f"resumed from snaps/{snapshots[-1]} (epoch 3" in second.stdout, explain(second)
    resumed = _epochs(second.stdout)
    assert sorted(resumed) == [3], explain(second)
    assert resumed[3][1] > 70.0, explain(second)
