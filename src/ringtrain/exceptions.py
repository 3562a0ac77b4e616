"""Every error type ringtrain raises on purpose, in one place.

The tree::

    Exception
    ├── ValueError                        bad input: the message names the value and ends with HINT:
    │   ├── UsageError                    a command-line request that cannot work (CLI exit code 2)
    │   ├── SettingError                  a HOROVOD_* / RINGTRAIN_* variable with a bad value
    │   ├── ClusterEnvironmentError       a scheduler's variables are inconsistent or incomplete
    │   ├── DataError                     a dataset cannot be read (missing, wrong format, bad checksum)
    │   ├── UnknownWorkloadError          an unknown workload name (also a KeyError)
    │   ├── JobError                      bad input to a training job
    │   ├── SnapshotError                 a snapshot that cannot be resumed (damaged, foreign, other model)
    │   │   └── DamagedSnapshotError      its bytes are not what was written (checksum, truncation)
    │   └── RendezvousMismatchError       the nodes of a job were started with different settings or versions
    ├── ConnectionError
    │   ├── ControlPlaneError             a peer closed its control connection, sent garbage or went silent
    │   ├── JobStoreError                 the job store cannot be reached, or its connection broke
    │   ├── AuthenticationError           a peer could not prove it belongs to this job (per-job secret)
    │   └── RendezvousFailedError         the nodes could not meet: one gave up, went silent, or node 0 left
    └── RuntimeError
        ├── HorovodInternalError          a collective failed; elastic training restores and retries
        ├── HostsUpdatedInterrupt         the set of hosts changed; elastic training re-initializes
        └── ElasticWorkerExit             the elastic driver ended this worker's part (removed, or job over)

Horovod scripts import the last two from ``horovod.common.exceptions`` (the shim maps that module
here). Import the others from here; a few are also importable from the modules that raise them
(``ringtrain.workloads``, ``ringtrain.train.snapshots`` ...), where earlier releases defined them.
"""

from __future__ import annotations


class UsageError(ValueError):
    """The user asked for something that cannot work; the message names the value and the fix."""


class SettingError(ValueError):
    """An environment variable (a ``HOROVOD_*`` or ``RINGTRAIN_*`` knob) holds a value that cannot work.

    The message names the variable, the value, the unit and what is allowed.
    """


class ClusterEnvironmentError(ValueError):
    """An environment was detected but its variables are inconsistent or incomplete."""


class DataError(ValueError):
    """A dataset cannot be read: missing folder, wrong file format, bad checksum.

    The message names the path and ends with ``HINT:`` and the fix.
    """


class UnknownWorkloadError(KeyError, ValueError):
    """An unknown workload name (a KeyError and a ValueError, so either ``except`` catches it)."""

    def __str__(self) -> str:
        # KeyError would print the message in quotes
        return str(self.args[0])


class JobError(ValueError):
    """Bad input to a training job (the message names the value and ends with ``HINT:``)."""


class SnapshotError(ValueError):
    """A snapshot that cannot be resumed: damaged, foreign, or from another model."""


class DamagedSnapshotError(SnapshotError):
    """A snapshot whose bytes are not what was written (checksum mismatch, truncated, unreadable).

    An older good snapshot can be resumed instead.
    """


class RendezvousMismatchError(ValueError):
    """The nodes of a job disagree at rendezvous (``--nnodes``, ranks per node, run id, port, versions).

    Every node that took part reports the same message, naming each difference and each node.
    """


class ControlPlaneError(ConnectionError):
    """A peer closed its control connection, sent garbage, or did not answer in time."""


class JobStoreError(ConnectionError):
    """The job's key-value store (:mod:`ringtrain.engine.job_store`) cannot be reached or went away."""


class AuthenticationError(ConnectionError):
    """A connection failed the per-job challenge-response: the other side does not hold this job's
    secret (``RINGTRAIN_JOB_SECRET``), or it is not a ringtrain peer at all."""


class RendezvousFailedError(ConnectionError):
    """The nodes of a job could not meet, or the group ended: a node gave up after its last restart, a
    node's agent stopped answering, node 0 (which hosts the rendezvous) went away, or a node came late."""


class HorovodInternalError(RuntimeError):
    """A collective failed: ranks disagreed on a request, a peer died, or the engine shut down.

    Elastic training catches it to restore the last committed state and re-initialize.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; elastic training should re-initialize.

    ``skip_sync`` is True when hosts were only removed, so the surviving state needs no broadcast.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated" + (" (skip sync)" if skip_sync else ""))
        self.skip_sync = skip_sync


class ElasticWorkerExit(RuntimeError):
    """The elastic driver ended this worker's part in the job; ``exit_code`` is what the process returns.

    0 when the re-formed group has no place for this worker (its host was removed, blacklisted or is
    over ``--max-np``); 1 when the job is stopping (the message says why). ``hvd.elastic.run`` turns it
    into a clean exit; elsewhere it propagates like any error.
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


__all__ = [
    "AuthenticationError",
    "ClusterEnvironmentError",
    "ControlPlaneError",
    "DamagedSnapshotError",
    "DataError",
    "ElasticWorkerExit",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "JobError",
    "JobStoreError",
    "RendezvousFailedError",
    "RendezvousMismatchError",
    "SettingError",
    "SnapshotError",
    "UnknownWorkloadError",
    "UsageError",
]
