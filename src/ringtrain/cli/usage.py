"""An argparse parser that answers a mistake with the right usage and a guess at what was meant.

Every ``ringtrain`` subcommand is built with :class:`HelpfulParser`: an unknown flag is reported with
the subcommand's own usage (not the top-level one) and, when a known flag is close enough,
``HINT: did you mean --batch-size?``. Abbreviations of long flags are refused: in a launcher whose
command follows its flags, a prefix that happens to be unique today would silently change meaning
when a flag is added.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (difflib), or None when none is close enough."""
    pool = sorted(set(candidates))
    if word in pool:
        return None
    # "--batch_size" and "--batch-size", "--np" and "-np": compare spellings without dashes' noise too
    normal = {c.lstrip("-").replace("_", "-"): c for c in pool}
    key = word.lstrip("-").replace("_", "-")
    if key in normal:
        return normal[key]
    found = difflib.get_close_matches(word, pool, n=1, cutoff=0.6)
    if not found:
        found = [normal[m] for m in difflib.get_close_matches(key, list(normal), n=1, cutoff=0.6)]
    return found[0] if found else None


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag ``parser`` knows, hidden ones and ``-h`` left out."""
    return [o for action in parser._actions if action.help != argparse.SUPPRESS
            for o in action.option_strings if o not in ("-h", "--help")]


def unknown_flags_message(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """``unrecognized arguments: ...`` plus a ``HINT: did you mean ...?`` for the first unknown flag."""
    message = f"unrecognized arguments: {' '.join(extras)}"
    known = option_strings(parser)
    for word in extras:
        if not word.startswith("-") or word == "-":
            continue
        flag = word.split("=", 1)[0]
        guess = did_you_mean(flag, known)
        if guess is not None:
            return f"{message}. HINT: did you mean {guess}?"
        return f"{message}. HINT: see the flags above (ringtrain {parser.prog.split()[-1]} --help)."
    return message


class HelpfulParser(argparse.ArgumentParser):
    """argparse with suggestions for unknown flags and invalid choices, and no abbreviations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # The parser of a (sub)command reports its own leftovers, with its own usage; otherwise argparse
        # hands them up and the top level prints its usage, which does not show the flag that was meant.
        has_subcommands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        if extras and not has_subcommands:
            self.error(unknown_flags_message(self, extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match and "HINT:" not in message:
            choices = re.findall(r"'([^']*)'", match.group(2))
            guess = did_you_mean(match.group(1), choices)
            if guess is not None:
                message += f". HINT: did you mean {guess}?"
        super().error(message)
