"""Workers started by ``horovodrun`` (gloo controller), or by ``ringtrain run``, which sets the same names.

horovodrun gives every worker ``HOROVOD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE/CROSS_RANK/CROSS_SIZE`` and
``HOROVOD_HOSTNAME``, plus the address of its HTTP rendezvous server
(``HOROVOD_GLOO_RENDEZVOUS_ADDR/_PORT``). That server is not a c10d store, so the main address and
port follow this rule:

1. ``MASTER_ADDR`` / ``MASTER_PORT`` when set (``ringtrain run`` sets both families);
2. otherwise, when every worker is on this host, 127.0.0.1;
3. otherwise the rendezvous host: horovodrun runs on the first host of ``-H`` in the usual case, and
   rank 0 runs on that first host.

The port is the rendezvous port + 1 (- 1 at the top of the range): every worker sees the same
rendezvous port, and the store must not take the driver's own port when both share a host.
"""

from __future__ import annotations

from collections.abc import Mapping

from ringtrain.env.base import LOOPBACK, ClusterEnvironment, read_int, read_port
from ringtrain.exceptions import ClusterEnvironmentError

_VARS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
         "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_CONTROLLER", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
         "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_ELASTIC", "MASTER_ADDR", "MASTER_PORT")


class HorovodEnvironment(ClusterEnvironment):
    """A horovodrun (gloo) worker: every value comes from a ``HOROVOD_*`` variable."""

    name = "horovod"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """``HOROVOD_RANK`` and ``HOROVOD_SIZE`` are set (the MPI controller sets neither)."""
        return "HOROVOD_RANK" in environ and "HOROVOD_SIZE" in environ

    def world_size(self) -> int:
        return read_int(self.environ, "HOROVOD_SIZE")

    def global_rank(self) -> int:
        return read_int(self.environ, "HOROVOD_RANK")

    def local_rank(self) -> int:
        return read_int(self.environ, "HOROVOD_LOCAL_RANK", 0)

    def local_world_size(self) -> int:
        return read_int(self.environ, "HOROVOD_LOCAL_SIZE", 1)

    def cross_rank(self) -> int:
        return read_int(self.environ, "HOROVOD_CROSS_RANK", super().node_rank())

    def cross_size(self) -> int:
        return read_int(self.environ, "HOROVOD_CROSS_SIZE", super().num_nodes())

    def node_rank(self) -> int:
        """The cross rank: hosts are filled in order, so it is the host index on homogeneous jobs."""
        return self.cross_rank()

    def node_rank_is_derived(self) -> bool:
        return "HOROVOD_CROSS_RANK" not in self.environ

    def num_nodes(self) -> int:
        """The cross size: the number of hosts (exact for local rank 0, or when homogeneous)."""
        return self.cross_size()

    def hostname(self) -> str:
        return self.environ.get("HOROVOD_HOSTNAME") or super().hostname()

    def default_main_address(self) -> str:
        if self.is_single_node():
            return LOOPBACK
        address = self.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "").strip()
        if not address:
            raise ClusterEnvironmentError(
                f"horovod: {self.world_size()} workers span several hosts but neither MASTER_ADDR nor "
                "HOROVOD_GLOO_RENDEZVOUS_ADDR is set. HINT: export MASTER_ADDR=<host of rank 0>.")
        return address

    def default_main_port(self) -> int:
        if "HOROVOD_GLOO_RENDEZVOUS_PORT" not in self.environ:
            return super().default_main_port()
        port = read_port(self.environ, "HOROVOD_GLOO_RENDEZVOUS_PORT")
        return port + 1 if port < 65535 else port - 1

    def source_variables(self) -> dict[str, str]:
        return {k: self.environ[k] for k in _VARS if k in self.environ}
