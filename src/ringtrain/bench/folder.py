"""The output folder: what of it belongs to a sweep, a reused one refused or cleared, a result read back.

A sweep writes ``scaling.json``, ``scaling.csv``, ``scaling.png`` and its runs' logs in ``logs/``.
Run again into the same folder, it would leave the earlier sweep's ``run-*`` logs beside its own, for
a different plan, with nothing saying which is which; so a folder that holds an earlier sweep is
refused unless ``--overwrite`` is given, which removes those files only (nothing else in the folder,
whoever put it there). An empty folder, or one with other files alone, is used as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ringtrain.exceptions import UsageError

RESULT_FILES = ("scaling.json", "scaling.csv", "scaling.png")
"""What a sweep writes at the top of its folder."""
LOG_PATTERNS = ("run-*.log", "startup-*.log", "link-probe.log")
"""What a sweep writes in ``logs/``: its runs (and their copies' logs), start-up probes, the link probe."""
SCHEMA = "ringtrain.bench/1"


def earlier_sweep(out: Path) -> list[Path]:
    """The files of an earlier sweep in ``out`` (empty when there are none, or no folder)."""
    if not out.is_dir():
        return []
    found = [out / name for name in RESULT_FILES if (out / name).is_file()]
    # an interrupted atomic write leaves its temporary file behind (outputs.write_atomic)
    found += sorted(p for p in out.glob(".scaling.*.tmp") if p.is_file())
    logs = out / "logs"
    if logs.is_dir():
        found += sorted(p for pattern in LOG_PATTERNS for p in logs.glob(pattern) if p.is_file())
    return found


def _describe(files: list[Path], out: Path) -> str:
    tops = [p.name for p in files if p.parent == out and not p.name.startswith(".")]
    logs = sum(1 for p in files if p.parent == out / "logs")
    return ", ".join(tops + ([f"{logs} log(s) in logs/"] if logs else []))


def prepare_out(out: Path, overwrite: bool = False) -> str | None:
    """Make ``out`` ready for a sweep: refuse one holding an earlier sweep (a UsageError naming the
    folder and the fix), or with ``overwrite`` remove that sweep's files only; returns the notice to
    show when files were removed, else None."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: that is a file, not a folder. HINT: give a folder for the results, "
                         "e.g. --out bench-results/run2.")
    files = earlier_sweep(out)
    if not files:
        return None
    if not overwrite:
        raise UsageError(f"--out {out} holds an earlier sweep ({_describe(files, out)}). HINT: give a new "
                         "folder (--out DIR), or add --overwrite to replace that sweep's files (nothing "
                         "else in the folder is touched).")
    what = _describe(files, out)
    for path in files:
        path.unlink(missing_ok=True)
    logs = out / "logs"
    if logs.is_dir() and not any(logs.iterdir()):
        logs.rmdir()
    return f"bench: --overwrite: removed the earlier sweep's files from {out} ({what})"


def load_result(folder: Path) -> dict[str, Any]:
    """``folder/scaling.json`` as written by a sweep; anything else is a UsageError naming the path
    and the fix (for ``--replot``)."""
    path = folder / "scaling.json"
    rerun = (f"HINT: give a folder a sweep wrote (its --out), or run the sweep again into it "
             f"(ringtrain bench ... --out {folder} --overwrite).")
    if not folder.is_dir():
        raise UsageError(f"--replot {folder}: no such folder. HINT: give the folder a sweep wrote its "
                         "results to (its --out; by default bench-results/WORKLOAD or bench-results/SCRIPT).")
    if not path.is_file():
        raise UsageError(f"--replot {folder}: no scaling.json in that folder. {rerun}")
    try:
        body = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--replot: cannot read {path} ({exc.strerror}). HINT: check that file's "
                         "permissions, or give another folder.") from None
    except UnicodeDecodeError:
        raise UsageError(f"--replot: {path} is not text, so not a sweep's scaling.json. {rerun}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--replot: {path} is not valid JSON ({exc.msg} at line {exc.lineno}). "
                         f"{rerun}") from None
    problem = result_problem(body)
    if problem:
        raise UsageError(f"--replot: {path} is not a ringtrain bench result ({problem}). {rerun}")
    return body


def result_problem(body: Any) -> str | None:
    """What keeps ``body`` from being drawn and tabulated again, or None when it can be."""
    if not isinstance(body, dict):
        return f"a JSON {type(body).__name__}, not an object"
    if body.get("schema") != SCHEMA:
        return f"schema {body.get('schema')!r}, not {SCHEMA!r}"
    rows = body.get("rows")
    if not isinstance(rows, list):
        return "no list of rows"
    if not isinstance(body.get("settings", {}), dict):
        return "its settings are not an object"
    for i, row in enumerate(rows):
        if not (isinstance(row, dict) and isinstance(row.get("strategy"), str)
                and isinstance(row.get("np"), int) and isinstance(row.get("status"), str)):
            return f"row {i} lacks its strategy, np or status"
    return None
