"""The one error type of the workloads package."""


class DataError(ValueError):
    """A dataset cannot be read: missing folder, wrong file format, bad checksum.

    The message names the path and ends with ``HINT:`` and the fix.
    """
