"""Detection under a real Open MPI ``mpirun`` (skipped where mpirun is not installed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

_PROBE = ("import json, sys; from ringtrain.env import detect_environment as d; e = d(); "
          "report = {'placement': e.placement().__dict__, 'warnings': e.validate()}; "
          "sys.stdout.write(json.dumps(report) + '\\n')")


def _reports(stdout: str) -> list[dict]:
    """Every JSON report in ``stdout``, also where two ranks' lines ran together."""
    decoder, found, start = json.JSONDecoder(), [], stdout.find("{")
    while start != -1:
        report, end = decoder.raw_decode(stdout, start)
        found.append(report)
        start = stdout.find("{", end)
    return found


def test_mpirun_ranks_detect_open_mpi() -> None:
    mpirun = shutil.which("mpirun")
    if mpirun is None or "Open MPI" not in subprocess.run([mpirun, "--version"], capture_output=True,
                                                           text=True).stdout:
        pytest.skip("Open MPI's mpirun is not installed: install it with `sudo bash .ci/system-setup`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "MASTER_", "SLURM_",
                                                                     "PBS_", "RANK", "WORLD_SIZE", "HOROVOD_",
                                                                     "TORCHELASTIC_"))}
    argv = [mpirun, "--oversubscribe", "-np", "2"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    result = subprocess.run([*argv, sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stderr
    reports = sorted(_reports(result.stdout), key=lambda r: r["placement"]["rank"])
    assert [r["placement"]["rank"] for r in reports] == [0, 1]
    for rank, report in enumerate(reports):
        p = report["placement"]
        assert (p["environment"], p["world_size"], p["local_rank"], p["local_world_size"]) == (
            "openmpi", 2, rank, 2)
        assert (p["node_rank"], p["num_nodes"], p["main_address"]) == (0, 1, "127.0.0.1")
        assert report["warnings"] == []
    assert reports[0]["placement"]["main_port"] == reports[1]["placement"]["main_port"]
