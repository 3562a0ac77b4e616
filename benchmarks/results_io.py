"""Where a benchmark's committed results go: ``results/<name>_<cpu>_<date>-<time>.{md,json}``."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any


def write_results(
    out_dir: Path, name: str, machine: dict[str, Any], text: str, payload: dict[str, Any]
) -> Path:
    """Write the Markdown report and the JSON record, named after the benchmark, CPU and UTC minute."""
    cpu = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M")
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / f"{name}_{cpu}_{stamp}"
    base.with_suffix(".md").write_text(text)
    base.with_suffix(".json").write_text(json.dumps({"machine": machine, **payload}, indent=2) + "\n")
    print(f"wrote {base}.md and .json")
    return base
