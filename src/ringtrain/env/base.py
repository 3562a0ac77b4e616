"""The contract every environment class fulfils: read-only values taken from the process environment."""

from __future__ import annotations

import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass


class EnvironmentError_(ValueError):
    """An environment was detected but its variables are inconsistent or incomplete."""


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job: every number a collective library needs."""

    environment: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    cross_rank: int
    cross_size: int
    main_address: str
    main_port: int
    hostname: str


class ClusterEnvironment(ABC):
    """One launcher or scheduler. Subclasses read variables only; they never set anything."""

    #: Short name shown by ``ringtrain env``.
    name: str = "base"

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ: Mapping[str, str] = os.environ if environ is None else environ

    @classmethod
    @abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """True when ``environ`` looks like this environment started the process."""

    @abstractmethod
    def world_size(self) -> int:
        """Number of processes in the job."""

    @abstractmethod
    def global_rank(self) -> int:
        """Index of this process in the job, 0 .. world_size-1."""

    @abstractmethod
    def local_rank(self) -> int:
        """Index of this process among the processes on its node."""

    @abstractmethod
    def local_world_size(self) -> int:
        """Number of processes on this node."""

    def node_rank(self) -> int:
        """Index of this node; by default derived from a homogeneous layout."""
        return self.global_rank() // max(self.local_world_size(), 1)

    def num_nodes(self) -> int:
        """Number of nodes; by default derived from a homogeneous layout."""
        return max(1, -(-self.world_size() // max(self.local_world_size(), 1)))

    def cross_rank(self) -> int:
        """Index of this node among nodes that run this local rank (Horovod's cross rank)."""
        return self.node_rank()

    def cross_size(self) -> int:
        """Number of nodes that run this local rank (Horovod's cross size)."""
        return self.num_nodes()

    def main_address(self) -> str:
        """Address of the rank-0 host, where the rendezvous store lives."""
        return self.environ.get("MASTER_ADDR", "127.0.0.1")

    def main_port(self) -> int:
        """Port of the rendezvous store."""
        return int(self.environ.get("MASTER_PORT", "29500"))

    def hostname(self) -> str:
        """Name of this host."""
        return socket.gethostname()

    def source_variables(self) -> dict[str, str]:
        """The variables this environment read, for ``ringtrain env``."""
        return {}

    def validate(self) -> list[str]:
        """Warnings about inconsistent settings; an empty list when all is well."""
        return []

    def placement(self) -> Placement:
        """All values at once."""
        return Placement(
            environment=self.name,
            rank=self.global_rank(),
            world_size=self.world_size(),
            local_rank=self.local_rank(),
            local_world_size=self.local_world_size(),
            node_rank=self.node_rank(),
            num_nodes=self.num_nodes(),
            cross_rank=self.cross_rank(),
            cross_size=self.cross_size(),
            main_address=self.main_address(),
            main_port=self.main_port(),
            hostname=self.hostname(),
        )


def read_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    """Read an integer variable, with an error that names the variable and its value."""
    value = environ.get(name)
    if value is None or value == "":
        if default is None:
            raise EnvironmentError_(f"{name} is not set. HINT: export {name}=<integer> or start the job "
                                    "through a launcher that sets it (ringtrain run, torchrun, srun, mpirun).")
        return default
    try:
        return int(value)
    except ValueError:
        raise EnvironmentError_(f"{name}={value!r} is not an integer. HINT: set {name} to a whole number.") from None
