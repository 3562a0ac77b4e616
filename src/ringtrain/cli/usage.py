"""An argparse parser that answers a mistake with one line: the error, then a guess at what was meant.

Every ``ringtrain`` subcommand is built with :class:`HelpfulParser`: an unknown flag is reported by the
subcommand itself and, when a known flag is close enough, ``HINT: did you mean --batch-size?``. The
usage is printed on request only (``--help``): 20-40 lines of it before the one useful line bury the
hint, so the error line points to ``--help`` instead. Abbreviations of long flags are refused: in a
launcher whose command follows its flags, a prefix that happens to be unique today would silently
change meaning when a flag is added.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, TypeVar, overload

_N = TypeVar("_N")
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")
_REQUIRED = re.compile(r"the following arguments are required: (.*)$")
#: Words people write for a choice that has another name here (``--device gpu`` means ``cuda``): a
#: spelling guess would offer ``cpu``, the opposite of what was meant.
SYNONYMS: dict[str, str] = {"gpu": "cuda", "gpus": "cuda", "nvidia": "cuda", "cuda:0": "cuda"}


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
    # without the dashes: "--" shared by every flag would make "--bogus" look like "--qos"
    found = [normal[m] for m in difflib.get_close_matches(key, list(normal), n=1, cutoff=0.6)]
    return found[0] if found else None


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag ``parser`` knows, hidden ones and ``-h`` left out; a snake_case spelling only where
    its action has no dashed one (a guess names the documented spelling)."""
    found = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        names = [o for o in action.option_strings if o not in ("-h", "--help")]
        dashed = {o.replace("_", "-") for o in names if "_" not in o}
        found += [o for o in names if "_" not in o or o.replace("_", "-") not in dashed]
    return found


def help_pointer(parser: argparse.ArgumentParser) -> str:
    """The sentence that replaces a printed usage: where the usage is, on request."""
    what = "commands" if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions) \
        else "options"
    return f"`{parser.prog} --help` lists the {what}."


def choice_guess(word: str, choices: Sequence[str]) -> str | None:
    """The choice meant by ``word``: a known synonym (``gpu`` -> ``cuda``), else the closest spelling."""
    synonym = SYNONYMS.get(word.strip().lower())
    if synonym is not None and synonym in choices:
        return synonym
    return did_you_mean(word, choices)


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
        return f"{message}. HINT: {help_pointer(parser)}"
    return message


class HelpfulParser(argparse.ArgumentParser):
    """argparse with suggestions for unknown flags and invalid choices, and no abbreviations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    # argparse's own overloads: the namespace given (of any class) is the one returned
    @overload
    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: None = None) -> tuple[argparse.Namespace, list[str]]: ...
    @overload
    def parse_known_args(self, args: Iterable[str] | None, namespace: _N) -> tuple[_N, list[str]]: ...
    @overload
    def parse_known_args(self, *, namespace: _N) -> tuple[_N, list[str]]: ...

    def parse_known_args(self, args: Iterable[str] | None = None,
                         namespace: Any = None) -> tuple[Any, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # The parser of a (sub)command reports its own leftovers, with its own usage; otherwise argparse
        # hands them up and the top level prints its usage, which does not show the flag that was meant.
        has_subcommands = any(isinstance(a, argparse._SubParsersAction) for a in self._actions)
        if extras and not has_subcommands:
            self.error(unknown_flags_message(self, extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE. HINT: ...`` and exit 2; the usage only comes with ``--help``."""
        if "HINT:" not in message:
            message += f". HINT: {self._hint(message)}"
        elif help_pointer(self) not in message:
            message += f" {help_pointer(self)}"
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _hint(self, message: str) -> str:
        """What to do about an argparse error: the choice or argument meant, and where the usage is."""
        match = _INVALID_CHOICE.search(message)
        if match:
            # newer Pythons list the choices without quotes: split, then strip any
            choices = [c.strip().strip("'") for c in match.group(2).split(",")]
            guess = choice_guess(match.group(1), choices)
            if guess is not None:
                return f"did you mean {guess}? {help_pointer(self)}"
        match = _REQUIRED.search(message)
        if match:
            missing = [a for a in self._actions if a.choices and not a.option_strings
                       and (a.metavar or a.dest) in match.group(1).split(", ")]
            if missing:
                name, values = missing[0].metavar or missing[0].dest, missing[0].choices or ()
                return f"give the {name}, one of {', '.join(map(str, values))}. {help_pointer(self)}"
            options = [a for a in self._actions if a.option_strings
                       and "/".join(a.option_strings) in match.group(1).split(", ")]
            if options:
                example = " ".join(f"{_long_name(a)} {_example_value(a)}" for a in options)
                return f"add e.g. `{example}`. {help_pointer(self)}"
        return help_pointer(self)


def _long_name(action: argparse.Action) -> str:
    """The spelling a user reads first: the first long flag, else the first one."""
    return next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])


def _example_value(action: argparse.Action) -> str:
    """A value to show for a required option: its first choice, a small count, or its metavar."""
    if action.choices:
        return str(next(iter(action.choices)))
    if action.type is int:
        return "2"
    return str(action.metavar or action.dest).upper()
