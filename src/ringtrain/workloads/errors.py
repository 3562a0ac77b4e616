"""The one error type of the workloads package, defined in :mod:`ringtrain.exceptions`."""

from ringtrain.exceptions import DataError

__all__ = ["DataError"]
