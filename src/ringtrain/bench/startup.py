"""A script's start-up, measured, for a script that reports nothing to ``ringtrain bench``.

Such a script has only its wall time, and wall time holds start-up: the interpreter, importing torch
(seconds on a small machine), the launcher starting the ranks and their rendezvous. Start-up does not
shrink with more processes (it grows), so a speedup from raw wall time says a short run scales worse
than it does. The sweep therefore runs::

    python -m ringtrain.bench.startup SCRIPT [ARGS]      (or -m MODULE [ARGS])

the same way as the script (a plain process at one process, ``ringtrain run -np N`` at N, with the
same environment): it imports what the script imports at module level (its top-level ``import`` and
``from ... import`` statements, also those in top-level ``try`` blocks), joins the job's process
group when it is a rank of one and the script sets one up (its source calls ``init_process_group``
or ``.init(``, as ``hvd.init()``), and exits. Its wall time is the start-up the table subtracts. What a
script does after its imports before training (reading data, building the model) stays in, which is
why a script that can should report (:mod:`ringtrain.bench.hook`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path

EXIT_CANNOT = 3
"""Exit code when the script's start-up cannot be reproduced (the sweep then uses raw wall time)."""


def probe_argv(command: tuple[str, ...] | list[str], python: str) -> list[str] | None:
    """The probe for ``command`` (``python [OPTIONS] SCRIPT|-m MODULE ARGS``), or None for anything else.

    The probe runs with the command's own interpreter, so it imports from the same environment.
    """
    if not command or not os.path.basename(command[0]).startswith("python"):
        return None
    rest = list(command[1:])
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        if rest[0] == "-c" or rest[0] == "-":
            return None  # a program given inline has no file to read the imports from
        rest.pop(0)
    if not rest or (rest[0] == "-m" and len(rest) < 2):
        return None
    return [command[0], "-m", "ringtrain.bench.startup", *rest]


def _script_path(args: list[str]) -> Path:
    if args[0] == "-m":
        spec = importlib.util.find_spec(args[1])
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise LookupError(f"module {args[1]!r} has no Python source to read its imports from")
        return Path(spec.origin)
    return Path(args[0])


def _imports(statements: list[ast.stmt]) -> list[ast.stmt]:
    return [n for n in statements if isinstance(n, ast.Import | ast.ImportFrom)]


def top_level_imports(source: str, filename: str = "<script>") -> ast.Module:
    """The module-level imports of ``source`` (also inside top-level ``try`` blocks), as a module."""
    tree = ast.parse(source, filename=filename)
    kept: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            kept.append(node)
        elif isinstance(node, ast.Try):  # try: import horovod.torch as hvd / except ImportError: ...
            body = _imports(node.body)
            handlers = [ast.ExceptHandler(type=h.type, name=h.name, body=_imports(h.body) or [ast.Pass()])
                        for h in node.handlers]
            if body:
                kept.append(ast.Try(body=body, handlers=handlers or [ast.ExceptHandler(
                    type=None, name=None, body=[ast.Pass()])], orelse=[], finalbody=[]))
    module = ast.Module(body=kept, type_ignores=[])
    return ast.fix_missing_locations(module)


def _is_rank() -> bool:
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def sets_up_process_group(source: str) -> bool:
    """True when the script's source starts a process group (torch's or Horovod's ``init``)."""
    return re.search(r"\binit_process_group\s*\(|\.init\s*\(", source) is not None


def main(args: list[str]) -> int:
    if not args:
        print("usage: python -m ringtrain.bench.startup SCRIPT [ARGS] | -m MODULE [ARGS]", file=sys.stderr)
        return 2
    try:
        path = _script_path(args)
        source = path.read_text()
        imports = top_level_imports(source, str(path))
    except (OSError, SyntaxError, LookupError, ImportError, ValueError) as exc:
        print(f"ringtrain.bench.startup: cannot read the script's imports: {exc}", file=sys.stderr)
        return EXIT_CANNOT
    # as Python runs a script: its folder first on sys.path, its arguments in sys.argv
    sys.path.insert(0, str(path.resolve().parent))
    sys.argv = [str(path), *args[2 if args[0] == "-m" else 1:]]
    namespace = {"__name__": "__ringtrain_startup__", "__file__": str(path)}
    try:
        exec(compile(imports, str(path), "exec"), namespace)  # the user's own imports
    except Exception as exc:  # any failure means: start-up not measurable this way
        print(f"ringtrain.bench.startup: the script's imports failed: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return EXIT_CANNOT
    if _is_rank() and sets_up_process_group(source):  # the ranks' rendezvous is start-up too
        from ringtrain.mpi_ops import barrier, init, shutdown

        init()
        barrier()
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
