"""How long an elastic job takes to go on after a worker is SIGKILLed, and how much work it redoes.

Runs ``ringtrain run -np 2 --min-np 1 --max-np 2`` on two host names of this machine (``localhost``
and ``127.0.0.1``) with the tests' elastic MNIST job (``tests/elastic/mnist_elastic.py``), kills the
worker on ``127.0.0.1`` at its stall gate (after its ``--stall-after``-th commit, while rank 0 waits
for it in an allreduce) and measures, per trial, from the kill:

- ``detected``: the driver reports the dead worker (its process exit);
- ``re-formed``: the driver publishes the next generation (every survivor left the broken one);
- ``resumed``: the replacement worker made its first commit in the re-formed group (it started,
  imported torch, joined, synced from rank 0 and trained ``--commit-every`` batches).

The replacement's start dominates ``resumed`` (a new Python process importing torch): compare it with
a whole-group restart, where every worker pays that and the work since the last snapshot on disk.

    python benchmarks/elastic_recovery.py --trials 5
    python benchmarks/elastic_recovery.py --trials 1 --quick

Prints a table (median, min, max over the trials) and writes ``benchmarks/results/
elastic_recovery_<cpu>_<date>-<time>.{json,md}`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "elastic" / "mnist_elastic.py"
RESULTS = ROOT / "benchmarks" / "results"


def _wait(condition, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def trial(folder: Path, samples: int, timeout: float) -> dict[str, float]:
    out = folder / "out"
    out.mkdir()
    hosts = folder / "discover.sh"
    hosts.write_text("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
    hosts.chmod(0o755)
    log = folder / "launcher.log"
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", "--min-np", "1", "--max-np", "2",
            "--host-discovery-script", str(hosts), sys.executable, str(SCRIPT), "--out", str(out),
            "--samples", str(samples), "--epochs", "1", "--stall-host", "127.0.0.1", "--stall-after", "3"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "RINGTRAIN_"))}
    with open(log, "w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        stalled = out / "stalled-w2.json"
        _wait(lambda: stalled.exists() or proc.poll() is not None, timeout, "the stall gate")
        pid = json.loads(stalled.read_text())["pid"]
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        detected = _wait(lambda: "worker w2 (rank 1 on 127.0.0.1) failed" in log.read_text(), timeout,
                         "the driver to see the failure")
        reformed = _wait(lambda: re.search(r"generation 2: ", log.read_text()) is not None, timeout,
                         "generation 2")
        resumed = _wait(lambda: (out / "progress-w3.json").exists(), timeout,
                        "the replacement's first commit")
        if proc.wait(timeout=timeout) != 0:
            raise RuntimeError(f"the job failed:\n{log.read_text()}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return {"detected": detected - killed, "re-formed": reformed - killed, "resumed": resumed - killed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one step may take")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    samples = 160 if args.quick else 480
    rows = []
    for number in range(args.trials):
        with tempfile.TemporaryDirectory(prefix="ringtrain-elastic-bench-") as folder:
            rows.append(trial(Path(folder), samples, args.timeout))
        print(f"trial {number + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in rows[-1].items()), flush=True)
    lines = ["| from the SIGKILL to | median s | min s | max s |", "|---|---|---|---|"]
    for key in rows[0]:
        values = [row[key] for row in rows]
        lines.append(f"| {key} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    cpu = re.sub(r"\W+", "-", platform.processor() or platform.machine()).strip("-") or "cpu"
    header = (f"elastic recovery, {args.trials} trial(s), {os.cpu_count()} cores, {platform.platform()}, "
              f"python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print(header)
    print("\n".join(lines))
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        stem = RESULTS / f"elastic_recovery_{cpu}_{time.strftime('%Y%m%d-%H%M%S')}"
        stem.with_suffix(".json").write_text(json.dumps({"header": header, "trials": rows}, indent=1))
        stem.with_suffix(".md").write_text(f"{header}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
