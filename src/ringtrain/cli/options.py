"""argparse actions whose defaults come from ``RINGTRAIN_<DEST>`` variables, and both spellings of a flag.

A flag on the command line wins over its variable; a bad value in either is reported by argparse the
same way (exit code 2).
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

ENV_PREFIX = "RINGTRAIN_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(dest: str) -> str:
    """The environment variable that sets the flag whose argparse ``dest`` is ``dest``."""
    return ENV_PREFIX + dest.upper()


def _parse_bool(name: str, value: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{name}={value!r} is not a boolean. HINT: set it to 1 or 0.")


class EnvOption(argparse.Action):
    """A valued option whose default comes from ``RINGTRAIN_<DEST>`` when that variable is set.

    The value is a string, so argparse still runs it through ``type`` and reports bad values the
    same way as bad flags (exit code 2).
    """

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 default: Any = None, help: str | None = None, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        if env_name(dest) in environ:
            default = environ[env_name(dest)]
        if help and help != argparse.SUPPRESS:
            help = f"{help} [env {env_name(dest)}]"
        super().__init__(option_strings, dest, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class EnvFlag(argparse.Action):
    """A switch (``--flag`` sets ``const``) whose default comes from ``RINGTRAIN_<DEST>=1|0``."""

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 const: Any = True, default: Any = None, help: str | None = None, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        name = env_name(dest)
        if name in environ:
            try:
                flag = _parse_bool(name, environ[name])
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(None, str(exc)) from None
            default = const if flag else (not const if isinstance(const, bool) else None)
        if help and help != argparse.SUPPRESS:
            help = f"{help} [env {name}]"
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)


class EnvAppend(argparse.Action):
    """A repeatable option (``-x A -x B=1``); its default list comes from ``RINGTRAIN_<DEST>``, split like a
    shell line (``RINGTRAIN_EXPORT='A B=1'``). Given on the command line, the flags replace the variable."""

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 default: Any = None, help: str | None = None, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        default = shlex.split(environ[env_name(dest)]) if env_name(dest) in environ else []
        if help and help != argparse.SUPPRESS:
            help = f"{help} [env {env_name(dest)}]"
        super().__init__(option_strings, dest, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = getattr(namespace, "_given_" + self.dest, False)
        items = list(getattr(namespace, self.dest) or []) if given else []
        setattr(namespace, "_given_" + self.dest, True)
        setattr(namespace, self.dest, [*items, values])


def whole_number(text: str) -> int:
    """An argparse ``type``: an integer, or an error that restates the text."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def number(text: str) -> float:
    """An argparse ``type``: a float, or an error that restates the text."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def at_least(kind: type, minimum: int) -> Any:
    """An argparse ``type`` that converts with ``kind`` and refuses values below ``minimum``."""
    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} must be >= {minimum}")
        return value

    convert.__name__ = kind.__name__
    return convert


def non_negative(kind: type) -> Any:
    """An argparse ``type`` that converts with ``kind`` and refuses values below zero."""
    return at_least(kind, 0)


def spellings(*names: str) -> list[str]:
    """The given option strings plus the snake_case spelling of every dashed long option."""
    out = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            out.append("--" + name[2:].replace("-", "_"))
    return out
