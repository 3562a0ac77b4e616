"""One node's agent, started by a driver: ``python -m ringtrain.launch.node_entry CONFIG_JSON``.

A multi-host ``ringtrain run`` starts this on every host (directly here, over ssh elsewhere), and a
``ringtrain run`` inside a Slurm batch script starts it on every node through ``srun``. The argument
is the node's :class:`~ringtrain.launch.config.LaunchConfig` as JSON, so the public ``ringtrain run``
parser needs no hidden flags and a new field reaches every node unchanged.

The JSON is visible in ``ps`` on every host: it must never carry a secret. Anything secret travels
another way: in the environment (srun forwards it; the local agent inherits it), or over the agent's
stdin, which ssh carries and the driver already holds open (its EOF means "stop").
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ringtrain.exceptions import UsageError
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.entry import launch

USAGE = "usage: python -m ringtrain.launch.node_entry CONFIG_JSON (started by ringtrain run, not by hand)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent described by the one JSON argument; returns its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        config = LaunchConfig.from_json(argv[0])
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        print(f"ringtrain run: error: the node's configuration cannot be read: {exc}", file=sys.stderr)
        return 2
    try:
        return launch(config)
    except UsageError as exc:
        print(f"ringtrain run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
