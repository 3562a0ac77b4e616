"""Session fixtures for the integration tests: Slurm clusters of one and two nodes, two namespace hosts.

Each is started once, on first use, and stopped at the end of the session. Where root, the Debian
packages or namespaces are missing, the fixture skips the tests that use it with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.netns import NamespaceHosts, start_hosts
from tests.integration.slurm import SlurmCluster, start_cluster, start_two_node_cluster


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A single-node Slurm cluster (munged, slurmctld, slurmd) with 4 task slots."""
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def netns_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceHosts]:
    """``hostA`` and ``hostB`` in network namespaces, each with sshd; link limited to 1 Gbit/s."""
    hosts = start_hosts(tmp_path_factory.mktemp("hosts"), bandwidth="1gbit")
    yield hosts
    hosts.stop()


@pytest.fixture(scope="session")
def slurm_two_nodes(netns_hosts: NamespaceHosts,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A Slurm cluster of the namespace hosts: slurmd -N hostA and -N hostB, slurmctld on hostA."""
    cluster = start_two_node_cluster(tmp_path_factory.mktemp("slurm2"), netns_hosts)
    yield cluster
    cluster.stop()
