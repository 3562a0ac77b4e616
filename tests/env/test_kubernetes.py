"""Pods of the Kubernetes operators: what each one sets (see ringtrain.env.kubernetes), read as it is."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from unittest import mock

import pytest

from ringtrain.env import detect_environment
from ringtrain.env.kubernetes import MpiJobLauncherEnvironment, kubernetes_pod, parse_nnodes_value
from ringtrain.exceptions import ClusterEnvironmentError

#: Trainer v2's torch runtime, pod 1 of TrainJob "mnist" with 2 nodes of 2 processes.
TRAINER_V2 = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_NODE_RANK": "1",
              "PET_MASTER_ADDR": "mnist-node-0-0.mnist", "PET_MASTER_PORT": "29500"}
#: PyTorchJob v1.9, worker 0 (pod index 1), nprocPerNode 2: RANK is the pod's index.
PYTORCHJOB = {"RANK": "1", "PET_NODE_RANK": "1", "WORLD_SIZE": "4", "PET_NNODES": "2",
              "PET_NPROC_PER_NODE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
              "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456", "PYTHONUNBUFFERED": "1"}
#: An older PyTorchJob (no PET_NODE_RANK, no nprocPerNode): processes per pod from WORLD_SIZE / nodes.
PYTORCHJOB_OLD = {"RANK": "2", "WORLD_SIZE": "6", "PET_NNODES": "3", "MASTER_ADDR": "job-master-0",
                  "MASTER_PORT": "23456"}
#: An elastic PyTorchJob: no master, no rank; the c10d rendezvous numbers the nodes.
PYTORCHJOB_ELASTIC = {"PET_NNODES": "1:3", "PET_RDZV_BACKEND": "c10d",
                      "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_ID": "job",
                      "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "3"}
JOBSET = {"JOB_COMPLETION_INDEX": "1", "MASTER_ADDR": "js-workers-0-0.js", "MASTER_PORT": "29400",
          "PET_NNODES": "2", "PET_NPROC_PER_NODE": "2"}


@pytest.mark.parametrize(("variables", "name", "expected"), [
    # (rank, world size, local rank, local size, node rank, nodes, main address, main port)
    (TRAINER_V2, "kubeflow-trainer", (2, 4, 0, 2, 1, 2, "mnist-node-0-0.mnist", 29500)),
    (PYTORCHJOB, "pytorchjob", (2, 4, 0, 2, 1, 2, "job-master-0", 23456)),
    (PYTORCHJOB_OLD, "pytorchjob", (4, 6, 0, 2, 2, 3, "job-master-0", 23456)),
    (JOBSET, "jobset", (2, 4, 0, 2, 1, 2, "js-workers-0-0.js", 29400)),
])
def test_placement_of_each_pod(variables: dict[str, str], name: str, expected: tuple) -> None:
    with mock.patch.dict(os.environ, variables, clear=True):
        env = detect_environment()
        p = env.placement()
    assert env.name == name
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size, p.node_rank, p.num_nodes,
            p.main_address, p.main_port) == expected
    assert kubernetes_pod(variables).name == name  # the launcher's view agrees


def test_one_process_per_pod_needs_no_launcher() -> None:
    env = detect_environment({**TRAINER_V2, "PET_NPROC_PER_NODE": "1"})
    assert (env.global_rank(), env.world_size()) == (1, 2)
    assert env.validate() == []


def test_several_processes_per_pod_tell_to_use_the_launcher() -> None:
    warnings = detect_environment(TRAINER_V2).validate()
    assert any("ringtrain run python train.py" in w for w in warnings), warnings


def test_elastic_pytorchjob_node_rank_comes_from_the_rendezvous() -> None:
    env = detect_environment(PYTORCHJOB_ELASTIC)
    assert env.name == "pytorchjob"
    assert env.nnodes() == (1, 3)
    with pytest.raises(ClusterEnvironmentError, match="rendezvous at job-worker-0:23456"):
        env.placement()
    assert env.source_variables()["PET_RDZV_BACKEND"] == "c10d"


def test_rank_beyond_world_size_names_both_variables() -> None:
    env = detect_environment({**PYTORCHJOB_OLD, "RANK": "7"})
    with pytest.raises(ClusterEnvironmentError, match=r"RANK=7 is beyond WORLD_SIZE=6"):
        env.node_rank()


def test_world_size_not_a_multiple_of_the_pods_is_named() -> None:
    env = detect_environment({**PYTORCHJOB_OLD, "WORLD_SIZE": "5"})
    with pytest.raises(ClusterEnvironmentError, match=r"WORLD_SIZE=5 is not a multiple of PET_NNODES=3"):
        env.local_world_size()


@pytest.mark.parametrize("value", ["two", "3:1", "0", "1:2:3", ""])
def test_bad_nnodes_names_the_variable(value: str) -> None:
    with pytest.raises(ClusterEnvironmentError, match="PET_NNODES=.* is neither a number of nodes"):
        parse_nnodes_value("PET_NNODES", value)


def test_a_process_started_by_the_launcher_in_a_pod_is_the_launchers() -> None:
    worker = {**PYTORCHJOB, "RANK": "3", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "r",
              "RINGTRAIN_ATTEMPT": "0"}
    assert detect_environment(worker).name == "ringtrain-run"


def _hostfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hostfile"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [
    "job-worker-0.job.default.svc slots=2\njob-worker-1.job.default.svc slots=2\n",  # Open MPI
    "job-worker-0.job.default.svc:2\njob-worker-1.job.default.svc:2\n",              # Intel MPI / MPICH
    "# workers\njob-worker-0.job.default.svc\njob-worker-0.job.default.svc\n\n"
    "job-worker-1.job.default.svc slots=2\n",                                         # bare host lines
])
def test_mpijob_launcher_reads_every_hostfile_form(tmp_path: Path, text: str) -> None:
    path = _hostfile(tmp_path, text)
    variables = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(path)}
    env = detect_environment(variables)
    assert isinstance(env, MpiJobLauncherEnvironment)
    assert env.hosts() == [("job-worker-0.job.default.svc", 2), ("job-worker-1.job.default.svc", 2)]
    assert (env.global_rank(), env.world_size()) == (0, 1)
    assert any("2 worker pod(s)" in w for w in env.validate())


def test_mpijob_hostfile_variable_alone_is_a_launcher(tmp_path: Path) -> None:
    path = _hostfile(tmp_path, "w0:1\n")
    assert detect_environment({"OMPI_MCA_orte_default_hostfile": str(path)}).name == "mpijob-launcher"
    # mpirun's ranks inherit the variable but are Open MPI's
    hostfile = {"OMPI_MCA_orte_default_hostfile": str(path)}
    rank = {**hostfile, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    assert detect_environment(rank).name == "openmpi"
    assert detect_environment({**hostfile, "K_MPI_JOB_ROLE": "worker"}).name == "single"


def test_mpijob_hostfile_without_a_usable_line_names_the_file(tmp_path: Path) -> None:
    path = _hostfile(tmp_path, "# nothing yet\n\n")
    env = detect_environment({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(path)})
    with pytest.raises(ClusterEnvironmentError, match=f"{path}: the hostfile has no usable line"):
        env.hosts()


def test_mpijob_hostfile_bad_line_names_file_and_line(tmp_path: Path) -> None:
    path = _hostfile(tmp_path, "w0 slots=2\nw1 slots=many\n")
    env = detect_environment({"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(path)})
    with pytest.raises(ClusterEnvironmentError, match=f"{path}:2: 'w1 slots=many'"):
        env.hosts()


def test_mpijob_discovery_script_beside_the_hostfile(tmp_path: Path) -> None:
    path = _hostfile(tmp_path, "w0:1\n")
    env = MpiJobLauncherEnvironment({"OMPI_MCA_orte_default_hostfile": str(path)})
    assert env.discovery_script() is None
    script = tmp_path / "discover_hosts.sh"
    script.write_text("#!/bin/sh\necho w0:1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert env.discovery_script() == str(script)


def test_mpijob_discovery_script_output_is_read_by_the_elastic_driver(tmp_path: Path) -> None:
    # the operator's discover_hosts.sh echoes one running worker per line, without slots
    from ringtrain.launch.elastic_hosts import parse_discovery_output

    output = "job-worker-0.job.default.svc\njob-worker-1.job.default.svc\n"
    assert parse_discovery_output(output, 2, MPIJOB_SCRIPT) == {"job-worker-0.job.default.svc": 2,
                                                               "job-worker-1.job.default.svc": 2}


MPIJOB_SCRIPT = "/etc/mpi/discover_hosts.sh"
