"""Slurm's compressed host lists and task counts: ``node[01-04,07]``, ``4(x2),2``.

Used by the Slurm environment and by the launcher (``ringtrain run`` inside an allocation).
"""

from __future__ import annotations

import re

from ringtrain.exceptions import ClusterEnvironmentError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ClusterEnvironmentError(
                    f"node list {text!r} has a ']' without '['. HINT: pass the value "
                    "of SLURM_JOB_NODELIST unchanged, e.g. node[01-04,07].")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise ClusterEnvironmentError(f"node list {text!r} has an unclosed '['. HINT: pass the value of "
                                "SLURM_JOB_NODELIST unchanged, e.g. node[01-04,07].")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(text: str, body: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']``, keeping the zero padding of each range's start."""
    out: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ClusterEnvironmentError(
                f"node list {text!r}: {item!r} is not a number or a range like 01-04. "
                "HINT: pass the value of SLURM_JOB_NODELIST unchanged.")
        start, end = match.group(1), match.group(2) or match.group(1)
        if int(end) < int(start):
            raise ClusterEnvironmentError(f"node list {text!r}: range {item!r} runs backwards. "
                                    "HINT: write ranges low-high, e.g. 01-04.")
        width = len(start)
        out.extend(str(n).zfill(width) for n in range(int(start), int(end) + 1))
    return out


def _expand_one(text: str, entry: str) -> list[str]:
    """One host expression, possibly with several bracket groups: ``r[1-2]n[1-2]`` gives four hosts."""
    bracket = entry.find("[")
    if bracket < 0:
        return [entry]
    close = entry.index("]", bracket)
    prefix, body, rest = entry[:bracket], entry[bracket + 1:close], entry[close + 1:]
    tails = _expand_one(text, rest) if rest else [""]
    return [prefix + number + tail for number in _expand_ranges(text, body) for tail in tails]


def expand_nodelist(text: str) -> list[str]:
    """Expand a Slurm host list: ``node[01-03,07],gpu-a1`` -> ``node01 node02 node03 node07 gpu-a1``.

    Handles several groups, zero padding, dashes in prefixes, several bracket groups in one name and
    plain comma-separated lists. Raises :class:`ClusterEnvironmentError` (a ``ValueError``) on malformed text.
    """
    hosts: list[str] = []
    for entry in _split_top_level(text.strip()):
        hosts.extend(_expand_one(text, entry))
    return hosts


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts: ``4(x2),2`` -> ``[4, 4, 2]``."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _TASKS.match(item.strip())
        if not match:
            raise ClusterEnvironmentError(f"tasks per node {text!r}: {item!r} is not N or N(xM). "
                                    "HINT: pass the value of SLURM_TASKS_PER_NODE unchanged, e.g. 4(x2),2.")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
