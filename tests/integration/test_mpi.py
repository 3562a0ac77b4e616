"""ringtrain under real MPI launchers: Open MPI's mpirun (ranks from OMPI_COMM_WORLD_*) and MPICH's
Hydra mpiexec (ranks from PMI_*); the rendezvous address (this host) is worked out by ringtrain.

The launchers are called by their package-specific names: with both installed, plain ``mpirun`` is
whichever the alternatives system picked.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.system import (
    clean_env,
    ringtrain_argv,
    skip_unless_commands,
)
from tests.ranks import free_port

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).with_name("allreduce_script.py")
#: A rank's report; matched anywhere, since ranks' output lines may run together on a shared stdout.
_RANK_LINE = re.compile(r"rank \d+ of \d+ local \d+ env [\w-]+ sum -?\d+")


def _mpirun(np: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
    skip_unless_commands("mpirun.openmpi")
    # Root in CI: Open MPI refuses without both variables. --oversubscribe: more ranks than cores.
    # MASTER_PORT only keeps concurrent test sessions apart; the address must come from ringtrain.
    env = clean_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                     "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "MASTER_PORT": str(free_port())})
    return subprocess.run(["mpirun.openmpi", "-np", str(np), "--oversubscribe", "--bind-to", "none", *argv],
                          env=env, capture_output=True, text=True, timeout=300)


def test_mpirun_allreduce_script_gets_ranks_from_open_mpi() -> None:
    result = _mpirun(3, [sys.executable, str(SCRIPT)])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(_RANK_LINE.findall(result.stdout))
    assert lines == [f"rank {r} of 3 local {r} env openmpi sum 3" for r in range(3)], result.stdout


def test_mpirun_check_passes() -> None:
    result = _mpirun(2, ringtrain_argv("check", "--sizes", "4K,64K", "--iterations", "2", "--timeout", "240"))
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"hello from rank {rank} of 2 (host " in result.stdout
    assert "environment: openmpi, 2 rank(s)" in result.stdout
    assert "all checks passed on 2 rank(s)" in result.stdout


def test_mpich_hydra_allreduce_script_gets_ranks_from_pmi() -> None:
    skip_unless_commands("mpiexec.hydra")
    env = clean_env({"MASTER_PORT": str(free_port())})
    result = subprocess.run(["mpiexec.hydra", "-n", "2", sys.executable, str(SCRIPT)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(_RANK_LINE.findall(result.stdout))
    assert lines == [f"rank {r} of 2 local {r} env mpich sum 1" for r in range(2)], result.stdout
