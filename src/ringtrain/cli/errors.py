"""Errors the command line turns into a message and exit code 2, without a traceback."""


class UsageError(ValueError):
    """The user asked for something that cannot work; the message names the value and the fix."""
