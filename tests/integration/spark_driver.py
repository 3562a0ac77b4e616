"""The Spark driver of tests/integration/test_spark_two_hosts.py, run on hostA through the shim
(``python -m ringtrain.shim spark_driver.py MASTER FOLDER CASE...``, with PYSPARK_PYTHON set to this
Python, which the executors then start).

One driver for every case, because a driver's JVM takes seconds to start; each case prints one line,
``CASE <name> <json>``, and a case that raises prints its error there instead of ending the others.

- ``horovod``: ``horovod.spark.run(train_fn, num_proc=2)`` with a Horovod training function;
- ``distributor``: ``TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)`` runs
  spark_torchrun_script.py (a Horovod-API script under torchrun);
- ``kill``: the rank on hostB SIGKILLs its own executor's JVM mid-run; the line says what
  ``horovod.spark.run`` raised and how many seconds after the kill.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path

import horovod.spark
import horovod.torch as hvd
import torch
from pyspark.sql import SparkSession

from ringtrain.shim import SHIM_DIR

SCRIPT = Path(__file__).resolve().with_name("spark_torchrun_script.py")


def train_fn(steps: int) -> dict[str, object]:
    """A few steps of a Horovod training loop: the averaged gradients keep both ranks' models equal."""
    hvd.init()
    torch.manual_seed(hvd.rank())  # different starting weights: the broadcast must make them equal
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(steps):
        optimizer.zero_grad()
        x = torch.randn(8, 4)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    print(f"rank {hvd.rank()} trained on {socket.gethostname()}")
    return {"rank": hvd.rank(), "size": hvd.size(), "local_size": hvd.local_size(),
            "cross_size": hvd.cross_size(), "host": socket.gethostname(),
            "in_sync": bool(torch.allclose(weights[0], weights[1]))}


def kill_own_executor(folder: str) -> None:
    """On hostB: SIGKILL the executor JVM this rank runs under; on hostA: keep allreducing."""
    hvd.init()
    hvd.allreduce(torch.tensor([1.0]), name="before")
    if socket.gethostname() == "hostB":
        pid = os.getppid()
        while pid > 1 and b"CoarseGrainedExecutorBackend" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        Path(folder, "killed_at").write_text(repr(time.time()))
        os.kill(pid, signal.SIGKILL)
        time.sleep(300)  # this process dies with its Spark worker process, or the run is over
    while True:
        hvd.allreduce(torch.tensor([1.0]), name="after")
        time.sleep(0.05)


def case_horovod(folder: Path) -> object:
    return horovod.spark.run(train_fn, args=(3,), num_proc=2, start_timeout=240)


def case_distributor(folder: Path) -> object:
    from pyspark.ml.torch.distributor import TorchDistributor

    out = folder / "distributor"
    out.mkdir()
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(str(SCRIPT), str(out))
    return sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda r: r["rank"])


def case_kill(folder: Path) -> object:
    try:
        horovod.spark.run(kill_own_executor, args=(str(folder),), num_proc=2, start_timeout=240)
    except Exception as exc:  # noqa: BLE001 - the error is what this case reports
        ended = time.time()
        killed = float((folder / "killed_at").read_text()) if (folder / "killed_at").exists() else None
        return {"type": type(exc).__name__, "message": str(exc),
                "seconds": None if killed is None else ended - killed, "executors": _executors()}
    return {"type": None}


def _executors() -> list[str]:
    infos = SparkSession.getActiveSession().sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return [f"{info.host()}:{info.port()}" for info in infos]


def main(master: str, folder: Path, cases: list[str]) -> int:
    spark = (SparkSession.builder.master(master).appName("ringtrain-spark-two-hosts")
             .config("spark.ui.showConsoleProgress", "false").config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             # the test's JVM options (tests/spark/jvm.py) for this driver's JVM and the executors'
             .config("spark.driver.extraJavaOptions", os.environ["SPARK_TEST_JAVA_OPTIONS"])
             .config("spark.executor.extraJavaOptions", os.environ["SPARK_TEST_JAVA_OPTIONS"])
             # TorchDistributor's torchrun ranks import horovod.torch: ringtrain's shim, on their path
             .config("spark.executorEnv.PYTHONPATH", str(SHIM_DIR))
             .config("spark.executorEnv.RINGTRAIN_JOB_SECRET", os.environ["SPARK_TEST_SECRET"])
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    try:
        for name in cases:
            try:
                result: object = globals()[f"case_{name}"](folder)
            except Exception:  # noqa: BLE001 - reported, and the next case still runs
                result = {"error": traceback.format_exc()}
            print(f"CASE {name} {json.dumps(result)}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:]))
