"""scaling.png: throughput and efficiency against processes, and the projection (needs matplotlib).

matplotlib is an optional extra (``pip install 'ringtrain[plot]'``); without it ``plot`` says so and
the table, JSON and CSV are still written.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ringtrain.bench.outputs import projection_method, write_atomic
from ringtrain.bench.plan import BARRIER, BASELINE, INDEPENDENT

INSTALL_HINT = "HINT: pip install 'ringtrain[plot]' (matplotlib), then rerun, or plot scaling.csv yourself."


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _lines(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each competitor's rows by process count, starting from the shared single-process baseline."""
    base = [r for r in rows if r["strategy"] == BASELINE and r["np"] == 1]
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["strategy"] != BASELINE:
            out.setdefault(r["strategy"], list(base)).append(r)
    if not out and base:
        out[BASELINE] = base
    return out


def _errors(rows: list[dict[str, Any]], key: str, low: str, high: str) -> list[list[float]]:
    lower, upper = [], []
    for r in rows:
        value = r.get(key)
        lower.append(max(0.0, value - r[low]) if value is not None and r.get(low) is not None else 0.0)
        upper.append(max(0.0, r[high] - value) if value is not None and r.get(high) is not None else 0.0)
    return [lower, upper]


#: Projection curves often coincide (every fast interconnect reaches ~1.0 for a small model): each
#: interconnect gets its own marker, and curves drawn later are thinner, so one never hides another.
PROJECTION_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


#: Line styles of the projection's methods, with their names for the legend: fp32 dashed and fp16 dotted
#: always (as plots before the other methods), the others in the order they appear.
FIXED_STYLES = {"fp32": ("--", "dashed"), "fp16": (":", "dotted")}
MORE_STYLES: tuple[tuple[Any, str], ...] = (
    ("-.", "dash-dot"), ((0, (8, 3)), "long-dashed"), ((0, (4, 1, 1, 1, 1, 1)), "dash-dot-dot"),
    ((0, (1, 3)), "sparse-dotted"), ((0, (8, 2, 2, 2)), "long-dash-dot"), ((0, (2, 2)), "short-dashed"),
)


def method_styles(methods: list[str]) -> dict[str, tuple[Any, str]]:
    """Each projected method's (matplotlib line style, its name): one style per method."""
    styles: dict[str, tuple[Any, str]] = {}
    spare = iter(MORE_STYLES)
    for label in dict.fromkeys(methods):
        styles[label] = FIXED_STYLES.get(label) or next(spare, ("-", "solid"))
    return styles


def projection_legend_title(styles: dict[str, tuple[Any, str]]) -> str:
    """Say which line style means which method, for the methods actually drawn only."""
    gradients = "" if any(label.startswith("localsgd") for label in styles) else " gradients"
    if len(styles) == 1:
        label, (_, name) = next(iter(styles.items()))
        return f"{name}: {label}{gradients}"
    return ", ".join(f"{name} {label}" for label, (_, name) in styles.items()) + gradients


def render(body: dict[str, Any]) -> bytes:
    """The figure as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = figure(body)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def figure(body: dict[str, Any]) -> Any:
    """The matplotlib figure (the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed, and none is touched
    import matplotlib.pyplot as plt

    rows = [r for r in body.get("rows", []) if r.get("efficiency") is not None or r["strategy"] == BASELINE]
    projection = body.get("projection") or []
    panels = 3 if projection else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4), constrained_layout=True)
    throughput_ax, efficiency_ax = axes[0], axes[1]
    has_items = any(r.get("items_per_second") is not None for r in rows)
    lines = _lines(rows)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    nps = sorted({r["np"] for r in rows} | {1})
    base = next((r for r in rows if r["strategy"] == BASELINE and r["np"] == 1), None)
    any_model = False
    for i, (strategy, members) in enumerate(lines.items()):
        members = [m for m in members if (m.get("items_per_second") if has_items else m.get("speedup"))
                   is not None]
        if not members:
            continue
        color = colors[i % len(colors)]
        style = {"marker": "o", "capsize": 3, "color": color, "label": strategy}
        if strategy == INDEPENDENT:  # the machine's ceiling, not a competitor
            style.update(color="black", linestyle=":", label="independent (no communication)")
        elif strategy == BARRIER:  # the machine's price of lockstep, not a competitor either
            style.update(color="black", linestyle=(0, (6, 2, 1, 2)), marker="s",
                         label="barrier (lockstep, no gradient exchange)")
        x = [m["np"] for m in members]
        if has_items:
            y = [m["items_per_second"] for m in members]
            err = _errors(members, "items_per_second", "items_per_second_min", "items_per_second_max")
        else:
            y, err = [m["speedup"] for m in members], None
        throughput_ax.errorbar(x, y, yerr=err, **style)
        eff = [m.get("efficiency") if m["strategy"] != BASELINE else 1.0 for m in members]
        eff_err = _errors([{**m, "efficiency": e} for m, e in zip(members, eff)], "efficiency",
                          "efficiency_min", "efficiency_max") if has_items else None
        efficiency_ax.errorbar(x, eff, yerr=eff_err, **style)
        lockstep = [(m["np"], m["lockstep_efficiency"]) for m in members
                    if m.get("lockstep_efficiency") is not None]
        if lockstep:  # independent copies: the ceiling of a synchronous strategy (from 1 at one process)
            efficiency_ax.plot(*zip((1, 1.0), *lockstep), linestyle="-.", marker="v", color="black",
                               label="lockstep ceiling (synchronous, free communication)")
        modelled = [(m["np"], m["model_efficiency"]) for m in members
                    if m.get("model_efficiency") is not None]
        if modelled:
            efficiency_ax.plot(*zip(*modelled), linestyle="none", marker="x", markersize=9, color=color)
            any_model = True
    if base is not None:
        ideal = [(base.get("items_per_second") if has_items else 1.0) or 0.0] * len(nps)
        throughput_ax.plot(nps, [v * n for v, n in zip(ideal, nps)], linestyle="--", color="grey",
                           label="ideal (linear)")
    efficiency_ax.axhline(1.0, linestyle="--", color="grey", label="ideal")
    if any_model:  # one legend entry for all the model's crosses (each in its strategy's colour)
        efficiency_ax.plot([], [], linestyle="none", marker="x", color="black", label="cost model")
    net = any(r.get("speedup_from") == "wall time minus start-up" for r in rows)
    throughput_ax.set_ylabel("items/s, all processes" if has_items else
                             "speedup (wall time minus start-up)" if net else "speedup (wall time)")
    throughput_ax.set_title("throughput" if has_items else "speedup")
    efficiency_ax.set_ylabel("parallel efficiency (speedup / processes)")
    efficiency_ax.set_title("efficiency")
    top = max([1.05] + [r.get("efficiency_max") or r.get("efficiency") or 0 for r in rows])
    efficiency_ax.set_ylim(0, top * 1.08)
    for ax in (throughput_ax, efficiency_ax):
        ax.set_xlabel("processes")
        ax.set_xticks(nps)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    throughput_ax.set_ylim(bottom=0)
    if projection:
        ax = axes[2]
        styles = method_styles([projection_method(e) for e in projection])
        names = list(dict.fromkeys(e["interconnect"] for e in projection))
        for order, entry in enumerate(projection):
            at = names.index(entry["interconnect"])
            pts = entry["points"]
            method = projection_method(entry)
            width = max(0.8, 3.2 - 0.5 * order)  # later curves thinner: an equal earlier one shows round it
            ax.plot([p["ranks"] for p in pts], [p["efficiency"] for p in pts],
                    linestyle=styles[method][0], marker=PROJECTION_MARKERS[at % len(PROJECTION_MARKERS)],
                    markersize=max(3.0, 8.0 - order), markerfacecolor="none", linewidth=width,
                    color=colors[at % len(colors)], zorder=2 + order,
                    label=entry["interconnect"] + ("" if method == "fp32" else f" {method}"))
        ax.set_xscale("log", base=2)
        ranks = [p["ranks"] for p in projection[0]["points"]]
        ax.set_xticks(ranks, [str(r) for r in ranks])
        ax.set_xlabel("ranks (projected)")
        ax.set_ylabel("efficiency (cost model)")
        ax.set_ylim(0, 1.05)
        ax.set_title("PROJECTION (model, not measured)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small", ncol=2, title=projection_legend_title(styles), title_fontsize="x-small")
    settings = body.get("settings", {})
    title = settings.get("workload") or " ".join(settings.get("command", []))[:60]
    machine = body.get("machine") or {}
    link = body.get("link") or {}
    where = f"; link: {link['note']}" if link.get("note") else ""
    # a script scales as it does itself: only a built-in workload's sweep chose weak or strong
    scaling = f" ({settings.get('scaling', '')} scaling)" if settings.get("workload") else ""
    fig.suptitle(f"ringtrain bench: {title}{scaling} on "
                 f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores{where}", fontsize="medium")
    return fig


def write_plot(body: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; returns None, or a message saying why there is no plot and how to get one."""
    if not have_matplotlib():
        return f"{path.name} not written: matplotlib is not installed. {INSTALL_HINT}"
    if not body.get("rows"):
        return f"{path.name} not written: no run finished."
    write_atomic(path, render(body))
    return None
