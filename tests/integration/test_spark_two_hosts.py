"""``horovod.spark.run`` and ``TorchDistributor`` on a real two-host Spark standalone cluster: the master
and one worker (one core) on hostA, one worker (one core) on hostB (network namespaces), the driver on
hostA. One cluster and one driver for the module: every JVM takes seconds to start.

The driver (spark_driver.py) runs the cases in order and prints one line for each; the tests read them.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import ROOT, clean_env, spawn_daemon, stop_daemons, tail, wait_for
from tests.spark.jvm import QUICK_JVM_OPTIONS

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed "
                                                "(pip install -e '.[test,ray,spark]')")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DRIVER = Path(__file__).resolve().with_name("spark_driver.py")
SPARK_CLASS = Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"
MASTER_PORT = 7077
CASES = ("horovod", "distributor", "kill")


def _spark_env(folder: Path) -> dict[str, str]:
    # small daemons, and Spark's scratch files in this module's folder rather than /tmp
    return clean_env({"SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM_OPTIONS,
                      "SPARK_LOCAL_DIRS": str(folder / "local"), "SPARK_LOG_DIR": str(folder / "logs"),
                      "SPARK_NO_DAEMONIZE": "1"})


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def driver_lines(netns_hosts: NamespaceHosts) -> Iterator[dict[str, object]]:
    """Start the cluster, run the driver once, and give each case's result; the cluster stops after."""
    folder = Path(tempfile.mkdtemp(prefix="rtspark", dir="/tmp"))
    master = f"spark://hostA:{MASTER_PORT}"
    logs = {name: folder / f"{name}.log" for name in ("master", "hostA", "hostB")}
    daemons = [spawn_daemon(netns_hosts.command("hostA", [
        str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "hostA", "--port",
        str(MASTER_PORT), "--webui-port", "18080"]), logs["master"], env=_spark_env(folder))]
    try:
        wait_for(lambda: "I have been elected leader" in _text(logs["master"]), 180, "the Spark master",
                 logs=[logs["master"]])
        for host in ("hostA", "hostB"):
            daemons.append(spawn_daemon(netns_hosts.command(host, [
                str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
                "--memory", "1g", "--work-dir", str(folder / f"work-{host}"), "--webui-port", "18081",
                master]), logs[host], env=_spark_env(folder)))
        for host in ("hostA", "hostB"):
            wait_for(lambda h=host: "Successfully registered with master" in _text(logs[h]), 180,
                     f"the Spark worker on {host}", logs=[logs[host]])
        # the driver's output goes to a file, which can be read while it runs
        driver_log = folder / "driver.log"
        with open(driver_log, "wb") as out:
            subprocess.run(netns_hosts.command("hostA", [sys.executable, "-m", "ringtrain.shim", str(DRIVER),
                                                         master, str(folder), *CASES]),
                           stdout=out, stderr=subprocess.STDOUT, timeout=560, cwd=ROOT,
                           env=clean_env({"SPARK_TEST_SECRET": secrets.token_hex(16),
                                          "SPARK_TEST_JAVA_OPTIONS": QUICK_JVM_OPTIONS,
                                          "PYSPARK_PYTHON": sys.executable}))
        output = driver_log.read_text(errors="replace")
        lines = dict(re.findall(r"^CASE (\w+) (.*)$", output, flags=re.M))
        context = tail(driver_log, 80) + "".join(f"\n--- {log}:\n{tail(log)}" for log in logs.values())
        yield {"cases": {name: json.loads(text) for name, text in lines.items()}, "output": output,
               "context": context}
    finally:
        stop_daemons(daemons, grace=20)
        shutil.rmtree(folder, ignore_errors=True)


def _case(driver_lines: dict[str, object], name: str) -> object:
    cases = driver_lines["cases"]
    assert isinstance(cases, dict)
    assert name in cases, f"the driver printed no line for {name}:\n{driver_lines['context']}"
    value = cases[name]
    assert not (isinstance(value, dict) and "error" in value), f"{value['error']}\n{driver_lines['context']}"
    return value


def test_horovod_spark_run_returns_both_ranks_results_from_the_two_hosts(driver_lines) -> None:
    results = _case(driver_lines, "horovod")
    assert [r["rank"] for r in results] == [0, 1]
    assert sorted(r["host"] for r in results) == ["hostA", "hostB"]
    assert all(r["size"] == 2 and r["local_size"] == 1 and r["cross_size"] == 2 for r in results)
    assert all(r["in_sync"] for r in results)  # the averaged gradients kept the models equal
    assert re.search(r"^\[0\] rank 0 trained on host[AB]$", driver_lines["output"], flags=re.M)
    assert "ringtrain: warning" not in driver_lines["output"]  # the job store was authenticated


def test_torch_distributor_runs_a_horovod_api_script_on_both_hosts(driver_lines) -> None:
    records = _case(driver_lines, "distributor")
    assert [r["rank"] for r in records] == [0, 1], driver_lines["context"]
    assert sorted(r["host"] for r in records) == ["hostA", "hostB"]
    assert all(r["size"] == 2 and r["sum"] == 3.0 and r["environment"] == "torchrun" for r in records)
    assert all(r["authenticated"] for r in records)  # the secret came from spark.executorEnv


def test_an_executor_killed_mid_run_fails_the_run_within_60_s_naming_its_host(driver_lines) -> None:
    outcome = _case(driver_lines, "kill")
    assert outcome["type"] == "ExecutorLostError", outcome
    assert re.search(r"the Spark executor on host hostB \(executor \d+: .+\) was lost", outcome["message"]), \
        f"{outcome}\n{driver_lines['context']}"
    assert outcome["seconds"] is not None, outcome
    assert outcome["seconds"] < 60, outcome
