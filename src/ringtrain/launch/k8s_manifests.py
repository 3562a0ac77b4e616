"""``ringtrain script kubernetes``: a manifest for ``kubectl apply`` whose pods run ``ringtrain run``.

One manifest per operator (``--kind``): a Kubeflow Trainer v2 TrainJob on the ``torch-distributed``
runtime, a PyTorchJob (Training Operator v1), an MPIJob (MPI Operator v2beta1) or a JobSet. In every
pod the command is ``ringtrain run COMMAND`` with no other flag: ``ringtrain run`` reads what the
operator sets (ringtrain.env.kubernetes, docs/kubernetes.md). Each manifest also holds:

- the job secret from a Kubernetes Secret (``secretKeyRef``), never inline: the nodes prove it to each
  other (docs/security.md). The Secret itself is created once with ``kubectl create secret`` (the
  manifest's header says how), so that the manifest can be kept in git without it;
- ``/dev/shm`` as a memory-backed ``emptyDir``: a container runtime's default is 64 MiB, and DataLoader
  workers hand every batch to their rank through shared memory, which runs out at that size;
- the CPU and memory requests and the GPU limit of each node's pod.

The YAML is written here without a YAML library: every string is double-quoted (JSON's string syntax
is valid YAML), so no value can be read as another type.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("trainjob", "pytorchjob", "mpijob", "jobset")
#: The variable ringtrain reads the job secret from, and the key it has in the Secret.
SECRET_VARIABLE = "RINGTRAIN_JOB_SECRET"
#: The rendezvous port of node 0 (torch's customary one; Trainer v2's runtime uses it too).
PORT = 29500
#: Shared memory per rank when ``--shm-size`` is not given: room for a few prefetched batches of each
#: DataLoader worker (a batch of 256 ImageNet-sized images is 150 MiB in float32).
SHM_PER_RANK_GIB = 2
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


@dataclass(frozen=True)
class KubernetesJob:
    """What ``ringtrain script kubernetes`` was asked for; checked on creation."""

    kind: str
    nodes: int
    nproc_per_node: int
    image: str
    command: tuple[str, ...]
    name: str = "ringtrain"
    gpus_per_node: int = 0
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = None
    secret_name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"--kind {self.kind!r} is not one of {', '.join(KINDS)}. "
                             "HINT: e.g. --kind trainjob.")
        if self.nodes < 1 or self.nproc_per_node < 1:
            raise ValueError(f"--nodes {self.nodes} and --nproc-per-node {self.nproc_per_node} must both "
                             "be at least 1. HINT: e.g. --nodes 2 --nproc-per-node 4.")
        if self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node {self.gpus_per_node} is negative. HINT: give 0 or more.")
        if not _NAME.match(self.name):
            raise ValueError(f"--name {self.name!r} is not a Kubernetes name: lower-case letters, digits and "
                             "'-', starting with a letter, at most 40 characters (pod names add suffixes). "
                             "HINT: e.g. --name mnist-2n.")
        if not self.image.strip():
            raise ValueError("--image is empty. HINT: name the container image with ringtrain and your "
                             "script installed, e.g. --image registry.example.com/team/train:1.0.")
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory), ("--shm-size", self.shm_size)):
            if value is not None and not _QUANTITY.match(value):
                raise ValueError(f"{flag} {value!r} is not a Kubernetes quantity. HINT: e.g. --cpu 8, "
                                 "--memory 32Gi, --shm-size 8Gi.")
        if not self.command:
            raise ValueError("no command to run. HINT: put it after --, e.g. ringtrain script kubernetes "
                             "--kind trainjob --nodes 2 --nproc-per-node 4 --image IMAGE -- python train.py")

    @property
    def secret(self) -> str:
        """Name of the Secret holding the job secret."""
        return self.secret_name or f"{self.name}-secret"

    @property
    def shm(self) -> str:
        """Size limit of ``/dev/shm``."""
        return self.shm_size or f"{SHM_PER_RANK_GIB * self.nproc_per_node}Gi"


def _secret_env() -> dict[str, Any]:
    # "{secret}" is replaced by the Secret's name in manifest()
    return {"name": SECRET_VARIABLE,
            "valueFrom": {"secretKeyRef": {"name": "{secret}", "key": SECRET_VARIABLE}}}


def _resources(job: KubernetesJob) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", job.cpu), ("memory", job.memory)) if v is not None}
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if job.gpus_per_node:  # extended resources are set as limits (the request follows)
        resources["limits"] = {"nvidia.com/gpu": str(job.gpus_per_node)}
    return resources


def _shm_volume(job: KubernetesJob) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.shm}}


_SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}


def _run_command(job: KubernetesJob) -> list[str]:
    return ["ringtrain", "run", *job.command]


def _container(job: KubernetesJob, name: str, env: list[dict[str, Any]] | None = None,
               command: list[str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": job.image, "command": command or _run_command(job),
                                 "env": [*(env or []), _secret_env()], "volumeMounts": [_SHM_MOUNT]}
    resources = _resources(job)
    if resources:
        container["resources"] = resources
    return container


def trainjob(job: KubernetesJob) -> dict[str, Any]:
    """Kubeflow Trainer v2: the ``torch-distributed`` runtime sets ``PET_*``; ``/dev/shm`` comes in
    through ``runtimePatches`` (the runtime's node job and container are both named ``node``)."""
    trainer: dict[str, Any] = {"image": job.image, "command": _run_command(job), "numNodes": job.nodes,
                               "numProcPerNode": job.nproc_per_node, "env": [_secret_env()]}
    if _resources(job):
        trainer["resourcesPerNode"] = _resources(job)
    pod = {"containers": [{"name": "node", "volumeMounts": [_SHM_MOUNT]}], "volumes": [_shm_volume(job)]}
    patch = {"manager": "ringtrain-script", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": job.name},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer,
                     "runtimePatches": [patch]}}


def pytorchjob(job: KubernetesJob) -> dict[str, Any]:
    """Training Operator v1: one Master pod and ``nodes - 1`` Workers, container ``pytorch``."""
    def replica(count: int) -> dict[str, Any]:
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {
            "containers": [_container(job, "pytorch")], "volumes": [_shm_volume(job)]}}}

    specs = {"Master": replica(1)}
    if job.nodes > 1:
        specs["Worker"] = replica(job.nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": job.name},
            "spec": {"nprocPerNode": str(job.nproc_per_node), "pytorchReplicaSpecs": specs}}


def mpijob(job: KubernetesJob) -> dict[str, Any]:
    """MPI Operator v2beta1: the launcher runs ``ringtrain run`` on the hostfile's workers over ssh; the
    workers run sshd (the image must provide it, as for any MPIJob)."""
    launcher = {"name": "launcher", "image": job.image, "command": _run_command(job), "env": [_secret_env()]}
    worker = _container(job, "worker", command=["/usr/sbin/sshd", "-De"])
    del worker["env"]  # the launcher hands the secret to the ranks it starts over ssh
    return {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": job.name},
            "spec": {"slotsPerWorker": job.nproc_per_node, "runPolicy": {"cleanPodPolicy": "Running"},
                     "mpiImplementation": "OpenMPI",
                     "mpiReplicaSpecs": {
                         "Launcher": {"replicas": 1, "restartPolicy": "OnFailure",
                                      "template": {"spec": {"containers": [launcher]}}},
                         "Worker": {"replicas": job.nodes, "restartPolicy": "OnFailure",
                                    "template": {"spec": {"containers": [worker],
                                                          "volumes": [_shm_volume(job)]}}}}}}


def jobset(job: KubernetesJob) -> dict[str, Any]:
    """JobSet: one Indexed Job of ``nodes`` pods; ``JOB_COMPLETION_INDEX`` is the node rank, and the
    manifest names node 0 (``<name>-node-0-0.<name>``: JobSet's pod host name and subdomain)."""
    env = [{"name": "MASTER_ADDR", "value": f"{job.name}-node-0-0.{job.name}"},
           {"name": "MASTER_PORT", "value": str(PORT)},
           {"name": "PET_NNODES", "value": str(job.nodes)},
           {"name": "PET_NPROC_PER_NODE", "value": str(job.nproc_per_node)}]
    container = _container(job, "node", env=env)
    container["ports"] = [{"containerPort": PORT}]
    pods = {"restartPolicy": "Never", "containers": [container], "volumes": [_shm_volume(job)]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": job.name},
            "spec": {"network": {"enableDNSHostnames": True},
                     "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                         "parallelism": job.nodes, "completions": job.nodes, "completionMode": "Indexed",
                         "backoffLimit": 0, "template": {"spec": pods}}}}]}}


_BUILDERS = {"trainjob": trainjob, "pytorchjob": pytorchjob, "mpijob": mpijob, "jobset": jobset}


def manifest(job: KubernetesJob) -> dict[str, Any]:
    """The operator's object for ``job``, as plain data."""
    text = json.dumps(_BUILDERS[job.kind](job)).replace('"{secret}"', json.dumps(job.secret))
    return json.loads(text)


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists, strings, integers and booleans."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return pad + "{}\n"
        out = []
        for key, item in value.items():
            if isinstance(item, (dict, list)) and item:
                out.append(f"{pad}{_scalar(key)}:\n{to_yaml(item, indent + 2)}")
            else:
                out.append(f"{pad}{_scalar(key)}: {_inline(item)}\n")
        return "".join(out)
    if isinstance(value, list):
        if not value:
            return pad + "[]\n"
        out = []
        for item in value:
            body = to_yaml(item, indent + 2) if isinstance(item, (dict, list)) and item else \
                f"{pad}  {_inline(item)}\n"
            out.append(f"{pad}- {body[indent + 2:]}")
        return "".join(out)
    return pad + _inline(value) + "\n"


def _inline(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, list) and not value:
        return "[]"
    return _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z][A-Za-z0-9_./-]*", value) and value.lower() not in (
            "true", "false", "yes", "no", "on", "off", "null", "y", "n") else json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


def render(job: KubernetesJob) -> str:
    """The manifest as YAML, after a header saying how to create the Secret and apply it."""
    header = [f"# ringtrain script kubernetes --kind {job.kind}: {job.nodes} node(s) x "
              f"{job.nproc_per_node} process(es), each node a pod running `ringtrain run` "
              "(docs/kubernetes.md).",
              "# Create the job secret once, then apply:",
              f"#   kubectl create secret generic {job.secret} --from-literal={SECRET_VARIABLE}="
              "$(python3 -c 'import secrets; print(secrets.token_hex(32))')",
              "#   kubectl apply -f job.yaml"]
    return "\n".join(header) + "\n" + to_yaml(manifest(job))
