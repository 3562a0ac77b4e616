"""The sweep's outputs: the terminal table, scaling.json, scaling.csv (every file written atomically).

scaling.json holds everything: settings, machine, link, every raw run with its ranks' report lines,
the table's rows, the model's inputs, its prediction for every measured row and the projection.
scaling.csv holds the table, one row per (strategy, processes).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from ringtrain.bench.hook import TAG
from ringtrain.bench.link import LinkFit, format_rate
from ringtrain.bench.machine import one_line
from ringtrain.bench.model import PAYS_MARGIN
from ringtrain.bench.plan import BARRIER, POWERSGD_PLAIN_STEPS, is_competitor, method_of
from ringtrain.bench.records import SHORT_RUN_S, SPREAD_WARNING

CSV_COLUMNS = ("workload", "strategy", "processes", "scaling", "runs", "failed", "seconds_per_step",
               "step_seconds_p50", "step_seconds_p95", "seconds_per_epoch", "wall_seconds",
               "items_per_second", "items_per_second_min", "items_per_second_max", "speedup", "efficiency",
               "spread", "speedup_from", "model_efficiency", "lockstep_efficiency", "status", "rank_spread",
               "startup_seconds", "net_wall_seconds", "unsteady", "timed_seconds", "too_short", "method",
               "wire_bytes_per_step", "compression_ratio", "warmup_steps")
"""scaling.csv's header, in order (columns added later go last: a reader by position keeps working)."""


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``path`` so that readers see the old file or the whole new one, never a part.

    The file gets the mode a plain ``open()`` would give it (0666 less the umask): the temporary file
    it is renamed from is created 0600, which would leave results unreadable to a group that shares them.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fp:
            fp.write(data.encode() if isinstance(data, str) else data)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(body: dict[str, Any], path: Path) -> None:
    write_atomic(path, json.dumps(_clean(body), indent=1, default=str) + "\n")


def _num(value: Any, digits: int = 6) -> str:
    return "" if value is None else f"{value:.{digits}g}"


def csv_text(body: dict[str, Any]) -> str:
    """The table as CSV."""
    settings = body.get("settings", {})
    workload = settings.get("workload") or " ".join(settings.get("command", []))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in body.get("rows", []):
        writer.writerow([workload, row["strategy"], row["np"], settings.get("scaling", ""), row["runs"],
                         row["failed"], _num(row.get("seconds_per_step")), _num(row.get("step_seconds_p50")),
                         _num(row.get("step_seconds_p95")), _num(row.get("seconds_per_epoch")),
                         _num(row.get("wall_seconds")), _num(row.get("items_per_second")),
                         _num(row.get("items_per_second_min")), _num(row.get("items_per_second_max")),
                         _num(row.get("speedup")), _num(row.get("efficiency")), _num(row.get("spread")),
                         row.get("speedup_from", ""), _num(row.get("model_efficiency")),
                         _num(row.get("lockstep_efficiency")), row["status"], _num(row.get("rank_spread")),
                         _num(row.get("startup_seconds")), _num(row.get("net_wall_seconds")),
                         "yes" if row.get("unsteady") else "", _num(row.get("timed_seconds")),
                         "yes" if row.get("too_short") else "", row.get("method") or "",
                         _num(row.get("wire_bytes_per_step")), _num(row.get("compression_ratio")),
                         "" if row.get("warmup_steps") is None else row["warmup_steps"]])
    return buffer.getvalue()


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.2f} s"


def _align(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def heading(body: dict[str, Any]) -> list[str]:
    """What was run, where, over which link."""
    s = body.get("settings", {})
    if s.get("workload"):
        what = s["workload"] + (f" ({s['arch']})" if s.get("arch") else "")
        timing = (f"{s['epochs']} epoch(s)" if s.get("epochs") else f"{s['steps']} timed steps") + \
            f" after {s['warmup_steps']} warm-up step(s)"
        what += f", {s['scaling']} scaling, {timing}"
    else:
        what = "script: " + " ".join(s.get("command", []))
    lines = [f"ringtrain bench: {what}, {s.get('repeats')} repeat(s), "
             f"{body.get('threads_per_process')} thread(s) per process"]
    if body.get("machine"):
        lines.append(f"machine: {one_line(body['machine'])}")
    if s.get("hosts"):
        lines.append("hosts: " + ",".join(f"{h['name']}:{h['slots']}" for h in s["hosts"]))
    link = body.get("link")
    if link and link.get("error"):
        lines.append(f"link: not measured ({link['error']})")
    elif link:
        note = f"; {link['note']}" if link.get("note") else ""
        lines.append(f"link ({link.get('kind')}): {LinkFit.from_dict(link).describe()}{note}")
    return lines


def table_text(body: dict[str, Any]) -> str:
    """The measured table, as printed at the end of a sweep."""
    rows = body.get("rows", [])
    per_epoch = any(r.get("seconds_per_epoch") for r in rows)
    has_items = any(r.get("items_per_second") is not None for r in rows)
    has_model = any(r.get("model_efficiency") is not None for r in rows)
    has_tail = any(r.get("step_seconds_p95") is not None for r in rows)
    net_wall = any(r.get("net_wall_seconds") is not None for r in rows)
    has_wire = shows_wire(rows)
    time_column = ("time/epoch" if per_epoch else "time/step" if has_items
                   else "wall - start-up" if net_wall else "wall time")
    header = ["processes", "strategy", time_column, *(["p95 step"] if has_tail else []), "items/s", "speedup",
              "efficiency", "spread", *(["wire/step", "vs fp32"] if has_wire else []),
              *(["model"] if has_model else []), "status"]
    table = [header]
    for r in rows:
        time_value = r.get("seconds_per_epoch") if per_epoch else r.get("seconds_per_step") if has_items \
            else r.get("net_wall_seconds") if net_wall else r.get("wall_seconds")
        speedup = "-" if r.get("speedup") is None else f"{r['speedup']:.2f}x"
        if r.get("speedup") is not None:
            speedup += {"wall time": " (wall)", "wall time minus start-up": " (net wall)"}.get(
                r.get("speedup_from", ""), "")
        line = [str(r["np"]), r["strategy"], _seconds(time_value),
                *([_seconds(r.get("step_seconds_p95"))] if has_tail else []),
                "-" if r.get("items_per_second") is None else f"{r['items_per_second']:,.1f}",
                speedup, "-" if r.get("efficiency") is None else f"{r['efficiency']:.2f}",
                _spread_cell(r)]
        if has_wire:
            line += wire_cells(r)
        if has_model:
            line.append("-" if r.get("model_efficiency") is None else f"{r['model_efficiency']:.2f}")
        line.append(r["status"])
        table.append(line)
    right = {i for i, name in enumerate(header) if name not in ("strategy", "status")}  # the numbers
    lines = heading(body) + [""] + _align(table, right=right)
    lines.append("")
    lines += timing_lines(body)
    lines.append("speedup and efficiency: " + ("items/s over the single-process baseline's" if has_items else
                                                "the single-process baseline's time over this row's")
                 + " (efficiency = speedup / processes); spread: (max - min) / median over the repeats"
                 + ("; n/a: one repeat, nothing to compare (--repeats 3)" if any(map(_single_repeat, rows))
                    else "")
                 + ("; ! above 20%" if any(r.get("unsteady") for r in rows) else "")
                 + ("; p95 step: 95th percentile of every rank's step times" if has_tail else "")
                 + ("; wire/step: bytes a rank hands to allreduces per step (Local SGD: an averaging's over "
                    "its steps), vs fp32: how many times fewer than fp32 gradients" if has_wire else "")
                 + ("; model: the cost model's efficiency for that row (docs/bench.md)" if has_model else ""))
    lines += step_notes(body)
    for r in rows:
        lockstep = r.get("lockstep_efficiency")
        if lockstep is not None:
            lines.append(f"lockstep ceiling at {r['np']} processes: efficiency {lockstep:.2f} (the "
                         f"{r['strategy']} copies, had every step waited for that step's slowest copy): "
                         "the best a synchronous strategy reaches here, even with free communication")
    lines += barrier_lines(rows)
    lines += spread_warnings(rows)
    lines += short_run_warnings(body)
    failures = [e for r in rows for e in r.get("errors", [])]
    if failures:
        lines.append("")
        lines += [f"FAILED {e}" for e in failures]
    if body.get("interrupted"):
        lines.append("interrupted: the table holds the runs finished before Ctrl-C")
    return "\n".join(lines) + "\n"


#: Methods a sweep could always compare: a table of these alone keeps the columns it always had.
_PLAIN_METHODS = frozenset({"none", "fp16"})


def shows_wire(rows: list[dict[str, Any]]) -> bool:
    """True when a competitor sends something other than fp32 or fp16 gradients every step (bf16,
    PowerSGD, Local SGD): then the table gets the bytes on the wire and their ratio against fp32."""
    for r in rows:
        method = method_of(r["strategy"]) if is_competitor(r["strategy"]) else None
        if method is not None and method.name not in _PLAIN_METHODS:
            return True
    return False


def wire_cells(row: dict[str, Any]) -> list[str]:
    """A row's ``wire/step`` and ``vs fp32`` cells (``-`` for the baseline, the references, a failure)."""
    wire, ratio = row.get("wire_bytes_per_step"), row.get("compression_ratio")
    if not is_competitor(row["strategy"]) or wire is None:
        return ["-", "-"]
    return [format_bytes(wire), "-" if ratio is None else format_ratio(ratio)]


def format_ratio(ratio: float) -> str:
    """``1.0x``, ``30.1x``, ``102x``: how many times fewer bytes than fp32."""
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:,.0f}x"


def format_bytes(nbytes: float) -> str:
    """``44.7 MB``, ``812 kB``, ``4 B`` (decimal units, three significant digits)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.0f} B"


def step_notes(body: dict[str, Any]) -> list[str]:
    """Where a strategy's runs took other warm-up or timed steps than the sweep's: PowerSGD's warm-up
    covers its uncompressed steps, Local SGD times whole averaging periods."""
    settings = body.get("settings", {})
    asked = settings.get("warmup_steps")
    warmups: dict[int, list[str]] = {}  # warm-up steps taken: the strategies that took them
    for r in body.get("rows", []):
        used = r.get("warmup_steps")
        if asked is not None and used is not None and used > asked:
            names = warmups.setdefault(used, [])
            if r["strategy"] not in names:
                names.append(r["strategy"])
    lines = [f"warm-up: {', '.join(names)} took {used} steps, not {asked}: PowerSGD sends its first "
             f"{POWERSGD_PLAIN_STEPS} steps uncompressed, and those are not what is measured"
             for used, names in warmups.items()]
    for name, planned in (settings.get("strategy_settings") or {}).items():
        every, steps = planned.get("sync_every"), planned.get("steps")
        if every and steps is not None and settings.get("steps") is not None and steps != settings["steps"]:
            lines.append(f"timed steps: {name} timed {steps}, not {settings['steps']}: whole averaging "
                         f"periods of {every} steps, so that every run holds as many averagings as steps / "
                         f"{every}")
    return lines


def _single_repeat(row: dict[str, Any]) -> bool:
    """True for a row with one good run only: it has no spread, which is not the same as none measured."""
    return row.get("spread") is None and row.get("runs", 0) - row.get("failed", 0) == 1


def _spread_cell(row: dict[str, Any]) -> str:
    """The spread over the repeats (``n/a`` with one good repeat, ``-`` with none), ``!`` marking a row
    whose repeats or ranks disagree by over 20 %."""
    if row.get("spread") is not None:
        cell = f"{100 * row['spread']:.1f}%"
    else:
        cell = "n/a" if _single_repeat(row) else "-"
    return cell + " !" if row.get("unsteady") else cell


def timing_lines(body: dict[str, Any]) -> list[str]:
    """What the time column holds for a script: its own reports, or wall time with start-up left out."""
    if not body.get("settings", {}).get("command"):
        return []
    runs = [r for r in body.get("runs", []) if r.get("status") == "ok"]
    reported = [r for r in runs if r.get("items_per_second") is not None]
    lines = []
    if reported:
        epochs = {r.get("epochs") for r in reported if r.get("epochs")}
        what = f"{min(epochs):g} epoch(s)" if epochs else f"{min(r.get('steps') or 0 for r in reported)} " \
            "step(s)" if all(r.get("steps") for r in reported) else "its timed part"
        lines.append(f"timed: what the script reported ({TAG} lines: {what} per run), start-up left out")
    if len(reported) < len(runs):
        startup = body.get("startup") or {}
        seconds = startup.get("seconds") or {}
        if seconds:
            measured = ", ".join(f"{v:.2f} s at {n} process(es)" for n, v in sorted(
                (int(k), v) for k, v in seconds.items()))
            lines.append(f"the script reported nothing (no {TAG} line): times are WALL TIME MINUS A MEASURED "
                         f"START-UP ({measured}: its imports and process-group set-up alone), "
                         "so they still hold its data loading and evaluation; report through "
                         "ringtrain.bench.report for exact figures (docs/bench.md)")
        if not seconds or startup.get("error"):
            lines.append(f"the script reported nothing (no {TAG} line) and its start-up was not measured "
                         f"({startup.get('error') or 'no probe ran'}): times are WALL TIME, start-up "
                         "included, which understates the speedup; report through ringtrain.bench.report "
                         "(docs/bench.md)")
    return lines


def spread_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """A warning per row whose repeats, or the ranks of one run, disagree by more than 20 %."""
    lines = []
    for r in rows:
        if not r.get("unsteady"):
            continue
        parts = []
        if r.get("spread") is not None and r["spread"] > SPREAD_WARNING:
            parts.append(f"its repeats differ by {100 * r['spread']:.0f}%")
        if r.get("rank_spread") is not None and r["rank_spread"] > SPREAD_WARNING:
            parts.append(f"the ranks of one run differ by {100 * r['rank_spread']:.0f}% in items/s")
        lines.append(f"WARNING: {r['np']} process(es) {r['strategy']}: {' and '.join(parts)} (above "
                     f"{100 * SPREAD_WARNING:.0f}%): the machine was not steady; rerun with more --repeats, "
                     "on a quieter machine, before publishing this row")
    return lines


def _more_work(settings: dict[str, Any], factor: float) -> str:
    """What gives every run ``factor`` times the timed work: the flag to raise, with its new value."""
    command = list(settings.get("command") or [])
    if not command:  # a built-in workload: its own flags
        if settings.get("epochs"):
            return f"raise --epochs to {math.ceil(settings['epochs'] * factor)} or more"
        steps = settings.get("steps") or 0
        return f"raise --steps to {10 * math.ceil(steps * factor / 10)} or more" if steps else \
            "give every run more steps (--steps)"
    for i, word in enumerate(command[:-1]):  # the script's own --epochs N (as examples/horovod_mnist.py)
        if word == "--epochs" and command[i + 1].isdigit():
            return (f"give the script --epochs {math.ceil(int(command[i + 1]) * factor)} or more (after --; "
                    f"it has {command[i + 1]})")
    return f"give the script about {math.ceil(factor)}x as much to train (more epochs or steps, after --)"


def short_run_warnings(body: dict[str, Any]) -> list[str]:
    """One warning for the rows whose timed part lasted under ``SHORT_RUN_S`` in some good repeat:
    their process counts and seconds, the threshold, and the flag that gives the runs enough work."""
    short = [r for r in body.get("rows", []) if r.get("too_short") and r.get("timed_seconds")]
    if not short:
        return []
    settings = body.get("settings", {})
    listed = ", ".join(f"{r['np']} process(es) {r['strategy']} {r['timed_seconds']:.2f} s" for r in short)
    factor = SHORT_RUN_S / min(r["timed_seconds"] for r in short)
    repeats = " and keep --repeats 3 or more" if (settings.get("repeats") or 0) < 3 else ""
    return [f"WARNING: timed part too short to trust (under {SHORT_RUN_S:g} s in a run): {listed}. One-off "
            "pauses and first-step set-up weigh too much in so short a run, so its speedup and efficiency "
            f"can change from one sweep to the next: {_more_work(settings, factor)}{repeats}, then rerun"]


def barrier_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What lockstep alone costs at each size, and how close each synchronous competitor comes to it."""
    lines = []
    for r in rows:
        if r["strategy"] != BARRIER or not r.get("efficiency"):
            continue
        rivals = [f"{o['strategy']} reaches {o['efficiency'] / r['efficiency']:.2f} of it" for o in rows
                  if o["np"] == r["np"] and o.get("efficiency") and is_competitor(o["strategy"])]
        lines.append(f"barrier at {r['np']} processes: efficiency {r['efficiency']:.2f} (ranks in lockstep, "
                     "4 bytes a step): what synchronization alone costs here"
                     + (f"; {', '.join(rivals)}" if rivals else ""))
    return lines


def projection_method(entry: dict[str, Any]) -> str:
    """The method label of a projection entry (``fp32``, ``powersgd:4``); entries written before the
    other methods existed say only ``fp16``."""
    return str(entry.get("method") or ("fp16" if entry.get("fp16") else "fp32"))


def _method_title(label: str, model: dict[str, Any]) -> str:
    """What a projection table's method sends, in a few words."""
    facts = (model.get("methods") or {}).get(label) or {}
    if label.startswith("powersgd"):
        rank = label.partition(":")[2]
        ratio = f", {format_ratio(facts['ratio'])} fewer bytes than fp32" if facts.get("ratio") else ""
        return f"{label} (PowerSGD, rank-{rank} factors{ratio}, 2 allreduce rounds per bucket):"
    if label.startswith("localsgd"):
        every = label.partition(":")[2]
        return (f"{label} (Local SGD / DiLoCo: fp32 parameter deltas averaged every {every} steps, after "
                "the step, none of it hidden):")
    return f"{label} gradients:"


def projection_text(body: dict[str, Any]) -> str:
    """The projection, set apart and labelled as a model's output, not a measurement."""
    projection = body.get("projection") or []
    if not projection:
        model = body.get("model") or {}
        return f"projection: none ({model['error']})\n" if model.get("error") else ""
    model = body["model"]
    ranks = [p["ranks"] for p in projection[0]["points"]]
    lines = ["PROJECTION: the cost model of docs/bench.md, NOT a measurement. Weak-scaling efficiency at "
             "p ranks, one per device,",
             f"from this machine's step time {model['compute_s'] * 1000:.1f} ms (backward "
             f"{100 * model['backward_share']:.0f}%), {model['gradient_bytes'] / 2**20:.1f} MiB of gradients "
             f"in {model['buckets']} bucket(s), ring allreduce overlapped with the backward pass."]
    for label in dict.fromkeys(projection_method(e) for e in projection):
        table = [["interconnect", *(str(p) for p in ranks), "link"]]
        for entry in (e for e in projection if projection_method(e) == label):
            cells = [f"{pt['efficiency']:.2f}" + ("*" if pt["latency_bound"] else "")
                     for pt in entry["points"]]
            link = f"{format_rate(entry['beta_bytes_per_s'])}, {entry['alpha_s'] * 1e6:.3g} us"
            table.append([entry["interconnect"], *cells, link])
        lines += ["", _method_title(label, model)]
        lines += _align(table, right=set(range(1, len(ranks) + 1)))
    lines.append("* latency-bound: real libraries switch to tree or hierarchical allreduce there, so the "
                 "ring model is pessimistic")
    pays = pays_text(body)
    if pays:
        lines += ["", *pays]
    return "\n".join(lines) + "\n"


def _ranks_range(first: int, last: int) -> str:
    return f"{first:,}" if first == last else f"{first:,}-{last:,}"


def pays_text(body: dict[str, Any]) -> list[str]:
    """Which method pays: per interconnect, the method the model's step time favours at each projected
    size (``pays``: fp32 unless another is at least 5 % faster), as ranges of ranks, and its speed against
    fp32's at the largest."""
    pays = body.get("method_that_pays") or []
    if not pays:
        return []
    labels = list(pays[0]["points"][0]["step_s"])
    table = []
    for entry in pays:
        spans: list[tuple[str, int, int]] = []  # (method, first ranks, last ranks)
        for point in entry["points"]:
            if spans and spans[-1][0] == point["pays"]:
                spans[-1] = (spans[-1][0], spans[-1][1], point["ranks"])
            else:
                spans.append((point["pays"], point["ranks"], point["ranks"]))
        text = ", ".join(f"{method} at {_ranks_range(a, b)}" for method, a, b in spans) + " ranks"
        last = entry["points"][-1]
        if last["pays"] != "fp32" and "fp32" in last["step_s"]:
            speed = last["step_s"]["fp32"] / last["step_s"][last["pays"]]
            text += f" ({last['ranks']:,} ranks: {speed:.1f}x fp32's speed)"
        table.append([f"{entry['interconnect']}:", text])
    margin = f"{100 * PAYS_MARGIN:.0f}%"
    return [f"METHOD THAT PAYS (the cost model, NOT a measurement): of {', '.join(labels)}, the one with the "
            f"shortest step" + (f", where it beats fp32 by {margin} or more (else fp32)" if "fp32" in labels
                                else ""),
            *("  " + line for line in _align(table, right=set())),
            "step time only: PowerSGD and Local SGD change what each step learns (accuracy per step is not "
            "modelled), and PowerSGD's matrix work is not counted"]


def validation_text(entries: list[dict[str, Any]], title: str = "MODEL VALIDATION") -> str:
    """Predicted against measured efficiency for every configuration with a measured link."""
    if not entries:
        return ""
    table = [["workload", "link", "strategy", "processes", "compute f", "measured", "model", "error"]]
    for e in entries:
        table.append([str(e.get("workload", "")), str(e.get("link", "")), e["strategy"], str(e["np"]),
                      f"{e['oversubscription']:.2f}", f"{e['measured_efficiency']:.3f}",
                      f"{e['predicted_efficiency']:.3f}", f"{e['error']:+.3f}"])
    errors = [abs(e["error"]) for e in entries]
    lines = [f"{title}: efficiency the cost model predicts against the measured one", *_align(
        table, right={3, 4, 5, 6, 7}),
        f"mean absolute error {sum(errors) / len(errors):.3f}, largest {max(errors):.3f} "
        f"(efficiency points, over {len(errors)} configuration(s))"]
    return "\n".join(lines) + "\n"
