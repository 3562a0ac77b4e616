"""Launcher names of other tools that run ``ringtrain run``: today ``horovodrun``.

``pip install ringtrain`` installs no ``horovodrun``: a console script of that name would be written over
real Horovod's (or Horovod's over ours), and uninstalling either package would then delete the other's
launcher. So the name is one deliberate step away (``ringtrain install-aliases``): a small shell script in
the environment's script folder that execs ``python -m ringtrain run "$@"`` with this interpreter. It is
never written where real Horovod is importable or where another ``horovodrun`` already is, and it carries a
marker line, so only ringtrain's own alias is ever replaced or removed.

``torchrun`` is not aliased: torch installs it with every build, and torch's own ``torchrun`` already runs
ringtrain scripts (``hvd.init()`` reads its variables). A torchrun line also runs under ringtrain's
launcher by changing its first word: ``ringtrain run --standalone --nproc_per_node=4 train.py 50 10``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ringtrain.exceptions import UsageError
from ringtrain.shim import real_horovod_importable

#: Alias name -> the ringtrain subcommand it runs.
ALIASES: dict[str, str] = {"horovodrun": "run"}

#: The second line of every alias script: how ringtrain recognises its own files.
MARKER = "# ringtrain alias, written by `ringtrain install-aliases`"


@dataclass(frozen=True)
class AliasResult:
    """What ``install`` or ``remove`` did to one alias."""

    name: str
    path: Path
    action: str
    """``written``, ``kept`` (already ours and current), ``removed`` or ``absent``."""
    note: str = ""


def default_directory() -> Path:
    """The folder where pip puts this environment's console scripts (a venv's ``bin``)."""
    return Path(sysconfig.get_path("scripts"))


def is_ours(path: Path) -> bool:
    """True when ``path`` is an alias script that ringtrain wrote."""
    try:
        with open(path, errors="replace") as fp:
            return MARKER in fp.read(4096)
    except OSError:
        return False


def script_text(name: str, python: str) -> str:
    """The alias script: exec this interpreter's ``ringtrain <subcommand>`` with the arguments as given."""
    return (f"#!/bin/sh\n{MARKER}; `ringtrain install-aliases --remove` deletes it.\n"
            f"# {name} ARGS... runs `ringtrain {ALIASES[name]} ARGS...` (same flags).\n"
            f'exec {shlex.quote(python)} -m ringtrain {ALIASES[name]} "$@"\n')


def install(directory: Path | None = None, python: str = sys.executable) -> list[AliasResult]:
    """Write every alias into ``directory``; refuses (UsageError) where real Horovod or a foreign file is."""
    directory = default_directory() if directory is None else directory
    if real_horovod_importable():
        raise UsageError("a real Horovod is installed in this environment; its horovodrun stays as it is. "
                         "HINT: run ringtrain's launcher as `ringtrain run` with the same flags, or install "
                         "the aliases in an environment without Horovod.")
    if not directory.is_dir():
        raise UsageError(f"--dir {str(directory)!r} is not a folder. "
                         "HINT: create it, or give a folder that is on PATH.")
    results = []
    for name in ALIASES:
        path = directory / name
        if path.exists() and not is_ours(path):
            raise UsageError(f"{path} exists and is not a ringtrain alias (another tool's {name}?); it "
                             f"is left alone. HINT: use `ringtrain {ALIASES[name]}` instead, or pick another "
                             "folder with --dir.")
        text = script_text(name, python)
        if path.exists() and path.read_text(errors="replace") == text:
            results.append(AliasResult(name, path, "kept"))
            continue
        tmp = path.with_name(f".{name}.ringtrain-tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, path)
        results.append(AliasResult(name, path, "written", _shadow_note(name, path)))
    return results


def remove(directory: Path | None = None) -> list[AliasResult]:
    """Delete ringtrain's aliases from ``directory``; files that ringtrain did not write stay."""
    directory = default_directory() if directory is None else directory
    results = []
    for name in ALIASES:
        path = directory / name
        if is_ours(path):
            path.unlink()
            results.append(AliasResult(name, path, "removed"))
        elif path.exists():
            results.append(AliasResult(name, path, "kept", "not a ringtrain alias; left alone"))
        else:
            results.append(AliasResult(name, path, "absent"))
    return results


def _shadow_note(name: str, path: Path) -> str:
    """Which file the shell will really run for ``name`` when that is not ``path``."""
    found = shutil.which(name)
    if found is None:
        return f"{path.parent} is not on PATH: add it, or call {path} by its full name"
    if Path(found).resolve() != path.resolve():
        return f"{found} comes first on PATH and is what `{name}` runs"
    return ""
