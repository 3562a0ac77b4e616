"""The contract every environment class fulfils: read-only values taken from the process environment."""

from __future__ import annotations

import os
import re
import socket
import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from ringtrain.exceptions import ClusterEnvironmentError

#: The name earlier releases used; :class:`ringtrain.exceptions.ClusterEnvironmentError` is the type.
EnvironmentError_ = ClusterEnvironmentError


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
        """Address of the rank-0 host, where the rendezvous store lives; ``MASTER_ADDR`` always wins."""
        explicit = self.environ.get("MASTER_ADDR", "").strip()
        return explicit or self.default_main_address()

    def main_port(self) -> int:
        """Port of the rendezvous store; ``MASTER_PORT`` always wins."""
        if self.environ.get("MASTER_PORT", "").strip():
            return read_port(self.environ, "MASTER_PORT")
        return self.default_main_port()

    def default_main_address(self) -> str:
        """The main address when ``MASTER_ADDR`` is not set (subclasses apply their own rule)."""
        return LOOPBACK

    def default_main_port(self) -> int:
        """The main port when ``MASTER_PORT`` is not set (subclasses derive it from a job id)."""
        return DEFAULT_PORT

    def node_rank_is_derived(self) -> bool:
        """True when the node rank is computed from rank and local size (exact only if homogeneous)."""
        return True

    def is_single_node(self) -> bool:
        """True when every process of the job runs on this host."""
        return self.local_world_size() >= self.world_size()

    def hostname(self) -> str:
        """Name of this host."""
        return socket.gethostname()

    def source_variables(self) -> dict[str, str]:
        """The variables this environment read, for ``ringtrain env``."""
        return {}

    def validate(self) -> list[str]:
        """Warnings about inconsistent settings; an empty list when all is well.

        Never raises: a value that cannot be read becomes a warning. Subclasses extend the list.
        """
        return consistency_warnings(self)

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


class OneProcessEnvironment(ClusterEnvironment):
    """An environment that runs this process alone: rank 0 of a world of 1, on one node."""

    def world_size(self) -> int:
        return 1

    def global_rank(self) -> int:
        return 0

    def local_rank(self) -> int:
        return 0

    def local_world_size(self) -> int:
        return 1


def read_int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    """Read an integer variable, with an error that names the variable and its value."""
    value = environ.get(name)
    if value is None or value == "":
        if default is None:
            raise EnvironmentError_(f"{name} is not set. HINT: export {name}=<integer> or start the job "
                                    "through a launcher that sets it (ringtrain run, torchrun, srun).")
        return default
    try:
        return int(value)
    except ValueError:
        raise EnvironmentError_(f"{name}={value!r} is not an integer. "
                                f"HINT: set {name} to a whole number.") from None


#: Where the rendezvous store lives when every process is on this host.
LOOPBACK = "127.0.0.1"
#: torch's customary port, used when nothing better is known.
DEFAULT_PORT = 29500
#: Ports derived from a job id fall in [PORT_BASE, PORT_BASE + 10000): above the well-known and
#: registered services most sites run, below Linux's ephemeral range (32768+), so a client socket
#: picked by the kernel cannot already hold it.
PORT_BASE = 15000


def read_port(environ: Mapping[str, str], name: str) -> int:
    """Read a TCP port variable (1..65535), with an error that names the variable and its value."""
    port = read_int(environ, name)
    if not 0 < port < 65536:
        raise EnvironmentError_(f"{name}={port} is not a TCP port. HINT: set {name} to a number in 1..65535.")
    return port


def port_from_job_id(job_id: str) -> int:
    """A port every process of a job computes alike: ``PORT_BASE`` + the last four digits of the job number.

    The job number is the first run of digits: Slurm's ``12345678`` gives 15000 + 5678 = 20678, PBS's
    ``8812.pbs01`` gives 15000 + 8812. An id without digits is hashed with CRC-32, which, unlike
    Python's ``hash``, is the same in every process.
    """
    match = re.search(r"\d+", job_id)
    if match:
        return PORT_BASE + int(match.group()[-4:])
    return PORT_BASE + zlib.crc32(job_id.encode()) % 10000


def same_host(a: str, b: str) -> bool:
    """Host names match, ignoring case and the domain (node files mix ``n1`` and ``n1.cluster``)."""
    return a.split(".")[0].lower() == b.split(".")[0].lower() if a and b else False


def consistency_warnings(env: ClusterEnvironment) -> list[str]:
    """The checks every environment shares: readable values, rank inside the world, a sane layout."""
    warnings: list[str] = []
    values: dict[str, int | str] = {}
    for name in ("world_size", "global_rank", "local_rank", "local_world_size", "node_rank", "num_nodes",
                 "main_address", "main_port"):
        try:
            values[name] = getattr(env, name)()
        except EnvironmentError_ as exc:
            if str(exc) not in warnings:  # getters built on the same variable fail alike
                warnings.append(str(exc))
    size, rank = values.get("world_size"), values.get("global_rank")
    local_size, local_rank = values.get("local_world_size"), values.get("local_rank")
    if isinstance(size, int) and size < 1:
        warnings.append(f"{env.name}: world size {size} is not positive. HINT: the launcher must start at "
                        "least one process; check the variables listed above.")
    if isinstance(size, int) and isinstance(rank, int) and not 0 <= rank < size:
        warnings.append(f"{env.name}: rank {rank} is outside the world of {size} processes (0..{size - 1}). "
                        "HINT: the rank and size variables come from different launchers; unset stale ones.")
    if isinstance(local_size, int) and isinstance(local_rank, int) and not 0 <= local_rank < local_size:
        warnings.append(f"{env.name}: local rank {local_rank} is outside the {local_size} processes of this "
                        "node. HINT: set LOCAL_RANK and LOCAL_WORLD_SIZE from the same launcher.")
    if isinstance(size, int) and isinstance(local_size, int) and local_size > 0:
        if local_size > size:
            warnings.append(f"{env.name}: local world size {local_size} is larger than the world size "
                            f"{size}. HINT: LOCAL_WORLD_SIZE counts processes on this node only.")
        elif size % local_size and env.node_rank_is_derived():
            warnings.append(f"{env.name}: local world size {local_size} does not divide world size {size}: "
                            "nodes run different numbers of processes, so node ranks derived from it are "
                            "guesses. HINT: start the same number of processes on every node.")
    return warnings
