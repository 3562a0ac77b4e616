"""The documented detection order: which environment wins when several sets of variables are present."""

from __future__ import annotations

import os

import pytest

import ringtrain.env as env_pkg
from ringtrain.env import ENVIRONMENTS, detect_environment

TORCHRUN = {"TORCHELASTIC_RUN_ID": "r1", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
RINGTRAIN_RUN = {**TORCHRUN, "RINGTRAIN_ATTEMPT": "0"}
HOROVOD = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"}
PLAIN = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
LSF = {"LSB_JOBID": "1", "JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "2"}
OMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
PALS = {"PALS_RANKID": "0", "PALS_LOCAL_RANKID": "0", "PMI_RANK": "0", "PMI_SIZE": "2"}
MPICH = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
MVAPICH = {"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2"}
SLURM_STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
              "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n1",
              "SLURM_TASKS_PER_NODE": "2"}
PMIX = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "ns", "WORLD_SIZE": "2"}
PBS = {"PBS_JOBID": "9.server"}
PYTORCHJOB = {"RANK": "1", "WORLD_SIZE": "4", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2",
              "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}
TRAINER_V2 = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
              "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}
JOBSET = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "js-workers-0-0.js", "PET_NNODES": "2"}
MPIJOB = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile"}
SLURM_SHELL = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "0"}

#: Highest priority first, as documented in ringtrain.env.
ORDER = [("ringtrain-run", RINGTRAIN_RUN),
         ("torchrun", TORCHRUN), ("horovod", HOROVOD), ("pytorchjob", PYTORCHJOB), ("env", PLAIN),
         ("kubeflow-trainer", TRAINER_V2), ("jobset", JOBSET), ("mpijob-launcher", MPIJOB), ("lsf", LSF),
         ("openmpi", OMPI),
         ("pals", PALS), ("mpich", MPICH), ("mvapich", MVAPICH), ("slurm", SLURM_STEP), ("pmix", PMIX),
         ("pbs", PBS), ("slurm-shell", SLURM_SHELL)]


@pytest.mark.parametrize(("name", "variables"), ORDER)
def test_each_environment_alone(name: str, variables: dict[str, str]) -> None:
    assert detect_environment(variables).name == name


#: Pairs that cannot be merged: plain env://'s RANK and WORLD_SIZE beside Trainer v2's PET_NNODES are
#: exactly what a PyTorchJob pod gets, so that union is a PyTorchJob (tested above), not plain env://.
UNMERGEABLE = {("env", "kubeflow-trainer"), ("env", "jobset")}


@pytest.mark.parametrize("index", range(len(ORDER) - 1))
def test_each_environment_beats_every_later_one(index: int) -> None:
    name, variables = ORDER[index]
    merged: dict[str, str] = {}
    for later_name, later in ORDER[index + 1:]:
        if (name, later_name) in UNMERGEABLE:
            continue
        merged.update(later)
    merged.update(variables)
    assert detect_environment(merged).name == name


def test_nothing_set_is_a_single_process() -> None:
    p = detect_environment({}).placement()
    assert (p.environment, p.rank, p.world_size, p.main_port) == ("single", 0, 1, 0)


def test_registry_lists_the_documented_order() -> None:
    assert [cls.name for cls in ENVIRONMENTS] == [name for name, _ in ORDER] + ["single"]
    for name, _ in ORDER:
        assert f"``{name}``" in env_pkg.__doc__


def test_default_environ_is_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        monkeypatch.delenv(key)
    for key, value in MVAPICH.items():
        monkeypatch.setenv(key, value)
    assert detect_environment().name == "mvapich"
