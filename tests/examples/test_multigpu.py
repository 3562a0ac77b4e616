"""examples/multigpu.py: killed after a snapshot, the same command line resumes where it stopped."""

import re
import subprocess

import pytest
import torch

from tests.examples.launch import example_env, explain, kill_tree, launch_command, run_example, unprefixed

ARGS = ["6", "2", "--subset", "1024", "--snapshot-dir", "snaps"]


def _run_until_snapshot(cwd, marker: str) -> str:
    """Start the script, read its output until ``marker``, then kill the whole process tree."""
    proc = subprocess.Popen(launch_command("multigpu.py", ARGS), cwd=cwd, env=example_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if marker in line:
                break
    finally:
        # SIGKILL, as a crashed node or a pre-empted job would: no chance to clean up.
        kill_tree(proc)
    return unprefixed("".join(seen))


def _epochs(text: str) -> list[int]:
    return [int(e) for e in re.findall(r"^Epoch (\d+) \| Batchsize", text, flags=re.M)]


def _losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\| Loss: ([\d.]+)", text)]


@pytest.mark.slow
def test_killed_run_resumes_from_its_snapshot(tmp_path) -> None:
    first = _run_until_snapshot(tmp_path, "Epoch 1 | Training snapshot saved")
    assert _epochs(first)[:2] == [0, 1], first
    folder = tmp_path / "snaps"
    # Output reaches us a little late: the workers may have saved once more before the kill landed.
    saved = torch.load(sorted(folder.glob("snapshot-*.pt"))[-1])["EPOCHS_RUN"]
    assert saved in (2, 4), first

    second = run_example("multigpu.py", ARGS, cwd=tmp_path)
    assert second.returncode == 0, explain(second)
    out = unprefixed(second.stdout)
    assert f"Resuming training from snapshot at Epoch {saved}" in out, explain(second)
    # No epoch is repeated or skipped, and training goes on from the trained weights, not from scratch.
    assert _epochs(out) == list(range(saved, 6)), explain(second)
    assert _losses(out)[0] < _losses(first)[0], (first, out)
    # the last two snapshots are kept (epochs 4 and 6), and no temporary file is left behind
    assert sorted(p.name for p in folder.glob("*.pt")) == ["snapshot-000000004.pt", "snapshot-000000006.pt"]
    assert torch.load(folder / "snapshot-000000006.pt")["EPOCHS_RUN"] == 6
