"""Where am I: one small class per launcher or scheduler, tried in a fixed order.

Detection order (the first class whose ``detect`` is true wins):

0. ``ringtrain-run``: ``ringtrain run``'s workers: torchrun's variables plus ``RINGTRAIN_ATTEMPT``;
1. ``torchrun``: ``TORCHELASTIC_RUN_ID`` and ``RANK``;
2. ``horovod``: ``HOROVOD_RANK`` and ``HOROVOD_SIZE`` (horovodrun's gloo workers);
3. ``pytorchjob``: a PyTorchJob pod: ``RANK`` (the pod's index) and ``PET_NNODES``, or ``PET_RDZV_ENDPOINT``;
4. ``env``: plain env://, ``RANK`` and ``WORLD_SIZE`` set by hand or by a platform;
5. ``kubeflow-trainer``: a Kubeflow Trainer v2 torch-runtime pod, ``PET_NODE_RANK`` (and no ``RANK``);
6. ``jobset``: a JobSet pod, ``JOB_COMPLETION_INDEX`` plus ``MASTER_ADDR`` or ``PET_MASTER_ADDR``;
7. ``mpijob-launcher``: an MPIJob's launcher pod, ``K_MPI_JOB_ROLE=launcher`` or its hostfile variable;
8. ``lsf``: jsrun's ``JSM_NAMESPACE_*`` in an LSF job;
9. ``openmpi``: ``OMPI_COMM_WORLD_*``;
10. ``pals``: Cray PALS ``PALS_RANKID``;
11. ``mpich``: MPICH / Intel MPI ``PMI_RANK`` and ``PMI_SIZE``;
12. ``mvapich``: ``MV2_COMM_WORLD_*``;
13. ``slurm``: a task of an ``srun`` step (not an interactive ``srun --pty bash``);
14. ``pmix``: ``PMIX_RANK`` alone (prterun);
15. ``pbs``: a PBS job (``pbsdsh`` task or the job script);
16. ``slurm-shell``: a batch script, ``salloc`` shell or interactive shell in a Slurm job: one process;
17. ``single``: no launcher, rank 0 of 1.

Why this order: variables set per process by the program that started *this* process beat
variables describing the allocation. torchrun and horovodrun set their own per-process names, also
inside Slurm or MPI jobs. A PyTorchJob's pod comes before plain env:// because its ``RANK`` and
``WORLD_SIZE`` describe pods (nodes), not processes; a process that torchrun or ``ringtrain run``
started in such a pod has ``TORCHELASTIC_RUN_ID`` and is detected above. The other operators' pods
come after plain env://: a ``RANK`` beside their variables was set by a launcher for one process.
MPI launchers come before Slurm because ``mpirun`` and ``mpiexec.hydra`` start their daemons on the
other nodes with ``srun``: their ranks inherit the *daemon's* Slurm step
(``SLURM_PROCID`` = the node, ``SLURM_NTASKS`` = the number of nodes), while ``OMPI_*`` / ``PMI_*``
describe the rank. Where Slurm's own MPI plugins set ``PMI_*`` / ``PMIX_*``, both agree. PALS comes
before MPICH because Cray's PMI sets ``PMI_RANK`` too but not Hydra's local-rank names. A bare PMIx
rank has no size of its own, so it follows Slurm (``srun --mpi=pmix`` is better read as Slurm). The
shells of Slurm and PBS jobs come last among schedulers: inside them any launcher above wins.

``MASTER_ADDR`` and ``MASTER_PORT``, when set, always give the main address and port.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ringtrain.env.base import ClusterEnvironment, EnvironmentError_, Placement, port_from_job_id
from ringtrain.env.horovod import HorovodEnvironment
from ringtrain.env.kubernetes import (
    JobSetEnvironment,
    MpiJobLauncherEnvironment,
    PyTorchJobEnvironment,
    TrainerV2Environment,
)
from ringtrain.env.lsf import LsfEnvironment
from ringtrain.env.mpi import (
    MpichEnvironment,
    MvapichEnvironment,
    OpenMpiEnvironment,
    PalsEnvironment,
    PmixEnvironment,
)
from ringtrain.env.pbs import PbsEnvironment, hosts_from_nodefile
from ringtrain.env.ringtrain_run import RingtrainRunEnvironment
from ringtrain.env.single import SingleProcessEnvironment
from ringtrain.env.slurm import (
    SlurmEnvironment,
    SlurmShellEnvironment,
    expand_nodelist,
    parse_tasks_per_node,
)
from ringtrain.env.torchrun import EnvVarsEnvironment, TorchElasticEnvironment
from ringtrain.exceptions import ClusterEnvironmentError

#: Detection order; the first class whose ``detect`` is true wins.
ENVIRONMENTS: list[type[ClusterEnvironment]] = [
    RingtrainRunEnvironment,
    TorchElasticEnvironment,
    HorovodEnvironment,
    PyTorchJobEnvironment,
    EnvVarsEnvironment,
    TrainerV2Environment,
    JobSetEnvironment,
    MpiJobLauncherEnvironment,
    LsfEnvironment,
    OpenMpiEnvironment,
    PalsEnvironment,
    MpichEnvironment,
    MvapichEnvironment,
    SlurmEnvironment,
    PmixEnvironment,
    PbsEnvironment,
    SlurmShellEnvironment,
    SingleProcessEnvironment,
]


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Return the first environment in ``ENVIRONMENTS`` that recognises ``environ``."""
    environ = os.environ if environ is None else environ
    for cls in ENVIRONMENTS:
        if cls.detect(environ):
            return cls(environ)
    return SingleProcessEnvironment(environ)


__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "ClusterEnvironmentError",
    "EnvVarsEnvironment",
    "EnvironmentError_",
    "HorovodEnvironment",
    "JobSetEnvironment",
    "LsfEnvironment",
    "MpiJobLauncherEnvironment",
    "MpichEnvironment",
    "MvapichEnvironment",
    "OpenMpiEnvironment",
    "PalsEnvironment",
    "PbsEnvironment",
    "Placement",
    "PmixEnvironment",
    "PyTorchJobEnvironment",
    "RingtrainRunEnvironment",
    "SingleProcessEnvironment",
    "SlurmEnvironment",
    "SlurmShellEnvironment",
    "TorchElasticEnvironment",
    "TrainerV2Environment",
    "detect_environment",
    "expand_nodelist",
    "hosts_from_nodefile",
    "parse_tasks_per_node",
    "port_from_job_id",
]
