"""Horovod's own elastic MNIST example, unmodified, under ``ringtrain run --min-np 1 --max-np 2``.

The example is read from a Horovod checkout named by ``RINGTRAIN_HOROVOD_CHECKOUT`` (``fetch
github:horovod/horovod`` and ``git worktree add``, or any clone): ringtrain copies none of Horovod's
files, so without a checkout the test is skipped. The example imports torchvision, which does not
import with this machine's CPU build of torch; ``stand_ins/torchvision`` supplies the two parts it
uses, reading MNIST from ``../shared/data/mnist``. Everything else (``import horovod.torch``, the
elastic driver, the worker that is SIGKILLed and replaced) is the real thing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.system import ROOT, SHARED_DATA, clean_env, wait_for

pytestmark = pytest.mark.slow

EXAMPLE = Path("examples") / "elastic" / "pytorch" / "pytorch_mnist_elastic.py"
STAND_INS = Path(__file__).resolve().with_name("stand_ins")


def _example() -> Path:
    checkout = os.environ.get("RINGTRAIN_HOROVOD_CHECKOUT", "")
    path = Path(checkout) / EXAMPLE
    if not checkout or not path.is_file():
        pytest.skip(f"no Horovod checkout with {EXAMPLE}: set RINGTRAIN_HOROVOD_CHECKOUT to one "
                    "(ringtrain copies none of Horovod's files)")
    return path


def _workers(example: Path) -> list[int]:
    """The pids of the elastic workers running ``example`` (not the launcher, whose command names it too)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ringtrain.launch.elastic_worker" in argv and str(example).encode() in argv:
            pids.append(int(entry.name))
    return sorted(pids)


def test_the_unmodified_example_survives_a_sigkilled_worker(tmp_path):
    example = _example()
    (tmp_path / "data" / "MNIST").mkdir(parents=True)
    (tmp_path / "data" / "MNIST" / "raw").symlink_to((SHARED_DATA / "mnist").resolve())
    discovery = tmp_path / "discover.sh"
    discovery.write_text("#!/bin/sh\necho localhost:2\n")
    discovery.chmod(0o755)
    env = clean_env({"PYTHONPATH": str(STAND_INS), "RINGTRAIN_TEST_MNIST_LIMIT": "25600"})
    log = tmp_path / "launcher.log"
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", "--min-np", "1", "--max-np", "2",
            "--host-discovery-script", str(discovery), sys.executable, str(example), "--epochs", "2",
            "--data-dir", str(tmp_path / "data")]
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
    try:
        # both workers have trained 10 batches of epoch 1 (the example logs every 10th batch on each rank)
        wait_for(lambda: log.read_text().count("Train Epoch: 1 [640/") >= 2 or proc.poll() is not None, 300,
                 "both workers training", logs=[log])
        workers = _workers(example)
        assert len(workers) == 2, (workers, log.read_text())
        os.kill(workers[-1], signal.SIGKILL)
        code = proc.wait(timeout=540)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log.read_text()
    assert code == 0, output
    assert "failed: killed by SIGKILL" in output, output
    assert "Train Epoch: 2 [" in output, output  # the job went on into its last epoch ...
    assert "Test set: Average loss" in output, output  # ... and ran the example's test() at the end
    assert "job finished after 1 re-formation(s) of the group" in output, output
