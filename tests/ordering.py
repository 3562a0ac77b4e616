"""The order the suite runs in: its longest modules first, the quick ones last.

pytest-xdist hands the tests out in collection order. In alphabetical order the longest modules (the
integration tests, the launches) came in clumps, and a run ended with one worker busy on a long
module while the other sat idle. Run first, the long modules spread over both workers, and the
contributor's-lane tests (thousands, under a second each) fill the gaps at the end. A module's tests
stay together and in their order, so a module-scoped fixture (a Ray or Spark cluster) is started once
per worker that runs the module.

How long a module takes comes from ``tests/module_seconds.json``, the seconds each module took in a
whole run (``python -m tests.ordering DURATIONS_TXT`` writes it from the output of ``python -m pytest
-n auto --durations=0``). A module not in it counts :data:`HEAVY_SECONDS` per slow or integration test.
A stale table only costs balance, never a test.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

#: Where the measured seconds of each module are kept.
SECONDS_FILE = Path(__file__).with_name("module_seconds.json")
#: What a slow or integration test of a module not yet measured is taken to cost.
HEAVY_SECONDS = 10.0
#: A line of pytest's ``--durations`` report: seconds, phase, test id.
_DURATION_LINE = re.compile(r"^\s*([\d.]+)s\s+(?:setup|call|teardown)\s+(\S+?)::")


class _Item(Protocol):
    """What the ordering reads of a collected test (pytest.Item has it)."""

    nodeid: str

    def get_closest_marker(self, name: str) -> object | None: ...


def _module(item: _Item) -> str:
    return item.nodeid.split("::", 1)[0]


def measured_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The table of seconds per module (empty when it is missing or unreadable: the estimate serves)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(module): float(seconds) for module, seconds in table.get("modules", {}).items()}


def longest_modules_first(items: Sequence[_Item], seconds: Mapping[str, float] | None = None) -> list[_Item]:
    """``items`` with the modules that take longest first; a module's tests keep their order, and
    modules of equal weight keep theirs."""
    seconds = measured_seconds() if seconds is None else seconds
    estimate: dict[str, float] = {}
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        module = _module(item)
        first_seen.setdefault(module, index)
        heavy = any(item.get_closest_marker(mark) is not None for mark in ("slow", "integration"))
        estimate[module] = estimate.get(module, 0.0) + (HEAVY_SECONDS if heavy else 0.0)
    weight = {module: seconds.get(module, guess) for module, guess in estimate.items()}
    ranked = sorted(enumerate(items), key=lambda pair: (-weight[_module(pair[1])],
                                                        first_seen[_module(pair[1])], pair[0]))
    return [item for _, item in ranked]


def seconds_from_durations(lines: Sequence[str]) -> dict[str, float]:
    """Seconds per module from a ``--durations=0`` report (setup, call and teardown added up)."""
    totals: dict[str, float] = {}
    for line in lines:
        match = _DURATION_LINE.match(line)
        if match:
            totals[match[2]] = round(totals.get(match[2], 0.0) + float(match[1]), 1)
    return dict(sorted(totals.items(), key=lambda pair: -pair[1]))


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.ordering DURATIONS_TXT (the output of python -m pytest -n auto "
              "--durations=0)", file=sys.stderr)
        return 2
    modules = seconds_from_durations(Path(argv[0]).read_text().splitlines())
    if not modules:
        print(f"{argv[0]}: no --durations lines found. HINT: run pytest with --durations=0", file=sys.stderr)
        return 2
    SECONDS_FILE.write_text(json.dumps({"about": "seconds per test module in one whole run; only the order "
                                                 "of the suite uses them (tests/ordering.py)",
                                        "modules": modules}, indent=1) + "\n")
    print(f"{SECONDS_FILE.name}: {len(modules)} modules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
