"""argparse actions whose defaults come from ``RINGTRAIN_<DEST>`` variables, and both spellings of a flag.

A flag on the command line wins over its variable; a bad value in either is reported by argparse the
same way (exit code 2), naming the variable when the value came from one.

torchrun's flags also take their defaults from ``PET_<DEST>``, as torchrun does (Kubeflow's operators
configure the pods' launcher this way); ``RINGTRAIN_<DEST>`` wins over ``PET_<DEST>``. Where each value
came from is kept in the parsed namespace: :func:`value_source` tells.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

ENV_PREFIX = "RINGTRAIN_"
#: torchrun's prefix: ``torchrun`` reads every flag's default from ``PET_<DEST>``.
TORCHRUN_PREFIX = "PET_"
#: Namespace attributes: the dests given on the command line, and each default's variable.
_GIVEN, SOURCES, ENV_ERRORS = "_given_on_command_line", "env_sources", "env_errors"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(dest: str) -> str:
    """The environment variable that sets the flag whose argparse ``dest`` is ``dest``."""
    return ENV_PREFIX + dest.upper()


def _default_from(environ: Mapping[str, str], dest: str, torchrun: bool) -> str | None:
    """The variable giving ``dest``'s default: ``RINGTRAIN_<DEST>``, else (torchrun's) ``PET_<DEST>``."""
    for name in (env_name(dest), TORCHRUN_PREFIX + dest.upper() if torchrun else None):
        if name and name in environ:
            return name
    return None


def _mark_given(namespace: argparse.Namespace, dest: str) -> None:
    given = set(getattr(namespace, _GIVEN, ()))
    given.add(dest)
    setattr(namespace, _GIVEN, given)


def _naming_variable(kind: Any, variable: str, value: str) -> Any:
    """``kind`` (an argparse ``type``) whose error names ``variable`` when converting its value."""
    def convert(text: str) -> Any:
        try:
            return kind(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            if text is value:  # argparse converts the default itself: the text came from the variable
                raise argparse.ArgumentTypeError(f"{variable}={text!r} is not valid ({exc}). HINT: fix or "
                                                 f"unset {variable}, or give the flag.") from None
            raise

    convert.__name__ = getattr(kind, "__name__", "value")
    return convert


def value_source(args: argparse.Namespace, dest: str) -> str:
    """Where ``args.<dest>`` came from: ``"command line"``, the variable's name, or ``"default"``."""
    if dest in getattr(args, _GIVEN, ()):
        return "command line"
    return getattr(args, SOURCES, {}).get(dest) or "default"


def record_sources(parser: argparse.ArgumentParser) -> None:
    """Keep every variable-given default's variable in the parsed namespace (for :func:`value_source`)."""
    sources = {a.dest: source for a in parser._actions if (source := getattr(a, "env_source", None))}
    errors = [error for a in parser._actions if (error := getattr(a, "env_error", None))]
    parser.set_defaults(**{SOURCES: sources, ENV_ERRORS: errors})


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
                 default: Any = None, help: str | None = None, torchrun: bool = False, **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        self.env_source = _default_from(environ, dest, torchrun)
        if self.env_source:
            default = environ[self.env_source]
            if kwargs.get("type") is not None:
                kwargs["type"] = _naming_variable(kwargs["type"], self.env_source, default)
        if help and help != argparse.SUPPRESS:
            pet = f", {TORCHRUN_PREFIX}{dest.upper()}" if torchrun else ""
            help = f"{help} [env {env_name(dest)}{pet}]"
        super().__init__(option_strings, dest, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _mark_given(namespace, self.dest)
        setattr(namespace, self.dest, values)


class EnvFlag(argparse.Action):
    """A switch (``--flag`` sets ``const``) whose default comes from ``RINGTRAIN_<DEST>=1|0``."""

    def __init__(self, option_strings: Sequence[str], dest: str, environ: Mapping[str, str] | None = None,
                 const: Any = True, default: Any = None, help: str | None = None, torchrun: bool = False,
                 **kwargs: Any) -> None:
        environ = os.environ if environ is None else environ
        name = _default_from(environ, dest, torchrun) or env_name(dest)
        self.env_source = name if name in environ else None
        self.env_error: str | None = None
        if name in environ:
            try:
                # The Training Operator writes PET_STANDALONE="" for `standalone: true`: a PET_ switch
                # that is present means on (torchrun itself fails on the empty value)
                empty_pet = name.startswith(TORCHRUN_PREFIX) and not environ[name].strip()
                flag = True if empty_pet else _parse_bool(name, environ[name])
            except argparse.ArgumentTypeError as exc:
                if not torchrun:
                    raise argparse.ArgumentError(None, str(exc)) from None
                # kept for the command that uses it: a pod's stray PET_* must not break every command
                self.env_error, flag = str(exc), False
            default = const if flag else (not const if isinstance(const, bool) else None)
        if help and help != argparse.SUPPRESS:
            pet = f", {TORCHRUN_PREFIX}{dest.upper()}" if torchrun else ""
            help = f"{help} [env {env_name(dest)}{pet}]"
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        _mark_given(namespace, self.dest)
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


def hang_seconds(text: str) -> float:
    """``--hang-timeout``'s type: positive seconds, or argparse's error naming the value and the fix."""
    from ringtrain.watch.node import parse_hang_timeout

    try:
        return parse_hang_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--hang-timeout ")) from None


def spellings(*names: str) -> list[str]:
    """The given option strings plus the snake_case spelling of every dashed long option."""
    out = list(names)
    for name in names:
        if name.startswith("--") and "-" in name[2:]:
            out.append("--" + name[2:].replace("-", "_"))
    return out
