"""Simulated Kubernetes pods: hostA and hostB given exactly what each operator gives its pods.

No Kubernetes cluster runs here (no container images, no API server). What a pod sees is reproduced
on the two namespace hosts instead: the operator's variables, the pod's host name (a pod's host name
is its pod name), the other pods' DNS names in the hosts' name resolution (``/etc/netns/<ns>/hosts``,
as cluster DNS would answer them), and for an MPIJob the mounted hostfile and ssh between the pods.
In each, ``ringtrain run python mnist_script.py`` runs with no other flag: a tiny real MNIST training
(examples/horovod_mnist.py on a few steps) whose every rank says its rank, local rank and host, and the
test accuracy and trained parameters that all ranks of both pods must agree on (the facts each operator
sets are in ringtrain.env.kubernetes). The late worker pod's test runs allreduce_script.py: it is about
the launcher's waiting, which a training would only make slower.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import NETNS_ETC, NamespaceHosts
from tests.integration.system import ROOT, clean_env, ringtrain_argv, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("allreduce_script.py")
_RANK = re.compile(r"rank (\d+) of (\d+) local (\d+) env (\S+) sum (-?\d+) host (\S+)")
MNIST = Path(__file__).with_name("mnist_script.py")
_MNIST_RANK = re.compile(r"mnist rank (\d+) of (\d+) local (\d+) host (\S+) accuracy ([0-9.]+) digest (\w+)")
PORT = "29517"


@contextlib.contextmanager
def pod_names(hosts: NamespaceHosts, names: dict[str, list[str]]) -> Iterator[None]:
    """Make each host answer to its pods' DNS names on both hosts (and in ssh's known hosts)."""
    files = [NETNS_ETC / h.namespace / "hosts" for h in hosts.hosts.values()] + [hosts.root / "known_hosts"]
    saved = {path: path.read_text() for path in files}
    try:
        lines = [f"{hosts.hosts[host].address}\t{' '.join(aliases)}" for host, aliases in names.items()]
        for path in files[:-1]:
            path.write_text(saved[path] + "\n".join(lines) + "\n")
        keys = {line.split()[0].split(",")[0]: " ".join(line.split()[1:])
                for line in saved[files[-1]].splitlines() if line.strip()}
        extra = [f"{alias} {keys[host]}" for host, aliases in names.items() for alias in aliases]
        files[-1].write_text(saved[files[-1]] + "\n".join(extra) + "\n")
        yield
    finally:
        for path, text in saved.items():
            path.write_text(text)


def as_pod(hosts: NamespaceHosts, host: str, pod: str, argv: list[str]) -> list[str]:
    """``argv`` on ``host`` under the pod's host name (Kubernetes sets a pod's host name to its name)."""
    return hosts.command(host, ["sh", "-c", f'hostname {pod} && exec "$@"', "sh", *argv])


def run_pods(hosts: NamespaceHosts, pods: list[tuple[str, str, dict[str, str]]], tmp_path: Path,
             timeout: float = 400) -> list[tuple[str, ...]]:
    """Start ``ringtrain run python mnist_script.py`` in every pod at once; all must succeed; each rank's
    (rank, size, local rank, host), after checking that every rank of every pod agrees on the test
    accuracy and the trained parameters."""
    procs = []
    for host, pod, env in pods:
        log = tmp_path / f"{pod}.log"
        with open(log, "w") as out:
            argv = as_pod(hosts, host, pod, ringtrain_argv("run", "python", str(MNIST)))
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(env), cwd=ROOT)
        procs.append((log, proc))
    try:
        codes = [proc.wait(timeout=timeout) for _, proc in procs]
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = "".join(f"--- {log.name}\n{log.read_text()}" for log, _ in procs)
    assert codes == [0] * len(procs), output
    lines = _MNIST_RANK.findall(output)
    assert lines, output
    # one model trained across the pods: the same accuracy (averaged over ranks) and parameters everywhere
    assert len({(accuracy, digest) for *_, accuracy, digest in lines}) == 1, output
    assert 0.0 < float(lines[0][4]) <= 1.0, output
    return sorted(line[:4] for line in lines)


def expected(hosts_of_ranks: list[str], local_size: int) -> list[tuple[str, ...]]:
    """Each rank's (rank, size, local rank, host) when rank r runs on ``hosts_of_ranks[r]``."""
    size = len(hosts_of_ranks)
    return sorted((str(r), str(size), str(r % local_size), host) for r, host in enumerate(hosts_of_ranks))


def test_trainer_v2_torch_runtime_pods(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    # TrainJob "mnist", 2 nodes x 2 processes: the torch runtime's PET_* and node 0's DNS name
    pods = {"hostA": "mnist-node-0-0", "hostB": "mnist-node-0-1"}
    common = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "mnist-node-0-0.mnist",
              "PET_MASTER_PORT": PORT}
    with pod_names(netns_hosts, {h: [p, f"{p}.mnist"] for h, p in pods.items()}):
        ranks = run_pods(netns_hosts, [(h, p, {**common, "PET_NODE_RANK": str(i)})
                                       for i, (h, p) in enumerate(pods.items())], tmp_path)
    assert ranks == expected(["mnist-node-0-0"] * 2 + ["mnist-node-0-1"] * 2, 2)


def test_pytorchjob_static_pods(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    # PyTorchJob "job": Master + 1 Worker, no nprocPerNode given to the pods but WORLD_SIZE = 4: RANK is the
    # pod's index, processes per pod WORLD_SIZE / PET_NNODES (an operator before v1.9: no PET_NODE_RANK)
    pods = {"hostA": "job-master-0", "hostB": "job-worker-0"}
    common = {"WORLD_SIZE": "4", "PET_NNODES": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": PORT,
              "PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": PORT, "PYTHONUNBUFFERED": "1"}
    with pod_names(netns_hosts, {h: [p] for h, p in pods.items()}):
        ranks = run_pods(netns_hosts, [(h, p, {**common, "RANK": str(i)})
                                       for i, (h, p) in enumerate(pods.items())], tmp_path)
    assert ranks == expected(["job-master-0"] * 2 + ["job-worker-0"] * 2, 2)


def test_pytorchjob_elastic_pods(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    # an elasticPolicy with 2 replicas (min = max = 2): c10d rendezvous hosted by the first worker's pod
    pods = {"hostA": "job-worker-0", "hostB": "job-worker-1"}
    env = {"PET_NNODES": "2:2", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": f"job-worker-0:{PORT}",
           "PET_RDZV_ID": "job", "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "0"}
    with pod_names(netns_hosts, {h: [p] for h, p in pods.items()}):
        ranks = run_pods(netns_hosts, [(h, p, env) for h, p in pods.items()], tmp_path)
    # the rendezvous numbers the nodes: one rank per pod, in either order
    assert sorted(r[:3] for r in ranks) == [("0", "2", "0"), ("1", "2", "0")]
    assert sorted(r[3] for r in ranks) == ["job-worker-0", "job-worker-1"]


def test_mpijob_launcher_pod(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    # MPIJob "job" with runLauncherAsWorker: the launcher pod (hostA) is the hostfile's first host and the
    # worker pod (hostB) the second, 2 slots each, named by their service DNS names; the launcher starts
    # its own ranks and reaches the worker over ssh. (A launcher apart from its workers, the default,
    # needs a third host; the two hosts here cannot give it a different address from a worker's.)
    pods = {"hostA": "job-launcher", "hostB": "job-worker-0"}
    names = {h: [p, f"{p}.job.default.svc"] for h, p in pods.items()}
    mpi = tmp_path / "etc-mpi"
    mpi.mkdir()
    (mpi / "hostfile").write_text("".join(f"{p}.job.default.svc slots=2\n" for p in pods.values()))
    env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(mpi / "hostfile"),
           "OMPI_MCA_orte_keep_fqdn_hostnames": "true"}
    with pod_names(netns_hosts, names):
        ranks = run_pods(netns_hosts, [("hostA", "job-launcher", env)], tmp_path)
    # the worker's ranks run under its sshd, which keeps the namespace host's own name
    assert ranks == expected(["job-launcher", "job-launcher", "hostB", "hostB"], 2)


def test_worker_pod_up_late_is_waited_for(netns_hosts: NamespaceHosts, tmp_path: Path) -> None:
    # The worker pod's DNS name appears only once the launcher has started (a pod that is still being
    # scheduled): ringtrain run tries it again within --start-timeout instead of failing at once.
    pods = {"hostA": "job-launcher", "hostB": "job-worker-0"}
    mpi = tmp_path / "etc-mpi"
    mpi.mkdir()
    (mpi / "hostfile").write_text("".join(f"{p}.job.default.svc slots=1\n" for p in pods.values()))
    env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": str(mpi / "hostfile"),
           "RINGTRAIN_START_TIMEOUT": "120"}
    log = tmp_path / "launcher.log"
    launcher_only = {"hostA": ["job-launcher", "job-launcher.job.default.svc"]}
    with pod_names(netns_hosts, launcher_only), open(log, "w") as out:
        argv = as_pod(netns_hosts, "hostA", "job-launcher", ringtrain_argv("run", "python", str(SCRIPT)))
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(env), cwd=ROOT)
        try:
            # the worker's name does not resolve yet: the launcher says so and keeps trying
            wait_for(lambda: "job-worker-0.job.default.svc is not up yet" in log.read_text()
                     or proc.poll() is not None, 120, "the launcher to wait for the worker pod", logs=[log])
            assert proc.poll() is None, log.read_text()
            with pod_names(netns_hosts, {"hostB": ["job-worker-0", "job-worker-0.job.default.svc"]}):
                code = proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    output = log.read_text()
    assert code == 0, output
    assert sorted(_RANK.findall(output)) == [("0", "2", "0", "ringtrain-run", "1", "job-launcher"),
                                             ("1", "2", "0", "ringtrain-run", "1", "hostB")]
