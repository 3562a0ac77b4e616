"""Errors the command line turns into a message and exit code 2, without a traceback.

Defined in :mod:`ringtrain.exceptions`; importable here as before.
"""

from ringtrain.exceptions import UsageError

__all__ = ["UsageError"]
