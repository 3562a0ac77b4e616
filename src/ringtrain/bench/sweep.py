"""Running a sweep: check the request, measure the link, run every planned process tree, write the report.

Each run is started as its own process group with its output in ``OUT/logs/``; a run that fails or
hangs past ``--timeout`` is marked failed and the sweep goes on, so one bad size costs one row.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ringtrain.bench.estimate import (
    WorkloadTiming,
    after_first_line,
    import_seconds,
    plan_line,
    start_import_timer,
    stop_import_timer,
    time_step,
)
from ringtrain.bench.hook import TAG, parse_output
from ringtrain.bench.link import fit_link
from ringtrain.bench.machine import describe_machine
from ringtrain.bench.plan import BenchSettings, RunSpec, plain_environment, plan_runs, startup_runs
from ringtrain.bench.records import Measurement, combine_reports, summarize
from ringtrain.env.cores import usable_cores
from ringtrain.exceptions import UsageError

#: Seconds a run gets to stop after SIGTERM (the launcher stops its ranks) before SIGKILL.
STOP_GRACE_S = 30.0


def check_workload(settings: BenchSettings, threads: int = 1) -> WorkloadTiming | None:
    """Fail before the sweep, with exit code 2, when the workload cannot run (data, arch, batch).

    Returns what loading it here took and one step's time, for the estimate (None for a script).
    """
    if settings.is_script:
        return None
    import math

    from ringtrain.train.job import input_errors
    from ringtrain.workloads import get_workload

    importer = start_import_timer()  # a fresh interpreter's imports, timed alongside what follows
    start = time.perf_counter()
    try:
        workload = get_workload(settings.workload or "")
        train_ds, _ = workload.datasets(data_dir=settings.data_dir, subset=settings.subset,
                                        seed=settings.seed)
        model = workload.model(settings.arch)
        load_s = time.perf_counter() - start
        batch = settings.batch_size or workload.defaults.batch_size
        if settings.epochs is None:
            for n in settings.nps:
                per_rank_batch = batch // n if settings.scaling == "strong" else batch
                if math.ceil(len(train_ds) / n) < max(1, per_rank_batch):
                    raise UsageError(f"--np {n} with a batch of {per_rank_batch} per process needs "
                                     f"{per_rank_batch * n} training items; {settings.workload} has "
                                     f"{len(train_ds)}. HINT: lower --batch-size or raise --subset.")
    except input_errors() as exc:
        stop_import_timer(importer)
        raise UsageError(str(exc)) from None
    except ValueError as exc:  # an unknown --arch
        stop_import_timer(importer)
        raise UsageError(str(exc).replace("arch=", "--arch ")) from None
    except BaseException:  # nothing will run: the timer's interpreter has nothing left to tell
        stop_import_timer(importer)
        raise
    step_s = time_step(workload, train_ds, model, batch, threads)
    return WorkloadTiming(items=len(train_ds), batch=batch, load_s=load_s, step_s=step_s,
                          import_s=import_seconds(importer))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a run's process group: SIGTERM (the launcher stops its ranks), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    keep = [line for line in text if line.strip() and "RINGTRAIN_BENCH" not in line]
    return "\n".join(keep[-lines:])


def _failure_reason(log: Path, code: int) -> str:
    """The most telling line of a failed run's output (an ``error:`` line, else the last line)."""
    tail = _tail(log, 40).splitlines()
    for line in reversed(tail):
        lowered = line.lower()
        if "error" in lowered and "traceback" not in lowered:
            return line.strip()[:300]
    return (tail[-1].strip()[:300] if tail else "no output") + f" (exit code {code})"


def execute(argv: list[str] | tuple[str, ...], env: dict[str, str], log: Path, timeout_s: float,
            copies: int = 1, plain: bool = False) -> tuple[int | None, float, list[str], bool]:
    """Run one process tree (or ``copies`` of it at once); returns (first non-zero exit code, or 0, or
    None on timeout; wall seconds; each copy's output; timed out). ``plain``: no launcher variables."""
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**(plain_environment(dict(os.environ)) if plain else os.environ), **env}
    logs = [log] if copies == 1 else [log.with_suffix(f".copy{i}.log") for i in range(copies)]
    files = [open(path, "wb") for path in logs]  # noqa: SIM115 - closed below, after the processes
    procs: list[subprocess.Popen[bytes]] = []
    start = time.perf_counter()
    try:
        for out in files:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            procs.append(subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=full_env, start_new_session=True))
        codes: list[int | None] = []
        timed_out = False
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - start))))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            for proc in procs:
                _stop(proc)
    except BaseException:  # Ctrl-C: take the run down with us
        for proc in procs:
            _stop(proc)
        raise
    finally:
        for out in files:
            out.close()
    wall = time.perf_counter() - start
    outputs = [path.read_text(errors="replace") for path in logs]
    if copies > 1:  # one log for the run, the copies one after the other
        log.write_text("".join(f"=== copy {i}\n{text}" for i, text in enumerate(outputs)))
        for path in logs:
            path.unlink()
    code = None if timed_out else next((c for c in codes if c != 0), 0)
    return code, wall, outputs, timed_out


def measure(run: RunSpec, out: Path, timeout_s: float) -> Measurement:
    """Run one planned run and turn its output into a Measurement."""
    log = out / "logs" / f"run-{run.index:03d}-np{run.np}-{run.strategy}-r{run.repeat + 1}.log"
    m = Measurement(index=run.index, repeat=run.repeat, strategy=run.strategy, np=run.np, argv=list(run.argv),
                    log=str(log.relative_to(out)))
    code, wall, outputs, timed_out = execute(run.argv, run.env, log, timeout_s, copies=run.copies,
                                             plain=run.plain)
    m.exit_code, m.wall_seconds = code, wall
    reports = []
    for i, output in enumerate(outputs):
        found = [r for r in parse_output(output) if "link_samples" not in r]
        if run.copies > 1:  # every copy is "rank 0 of 1": number them
            found = [{**r, "rank": i, "world_size": run.copies} for r in found]
        reports += found
    if timed_out:
        m.status, m.error = "failed", f"no exit after {timeout_s:g} s (--timeout); see {m.log}"
    elif code != 0:
        m.status, m.error = "failed", f"{_failure_reason(log, code or 0)}; see {m.log}"
    combine_reports(m, reports)
    return m


def probe_link(settings: BenchSettings, out: Path, python: str = sys.executable) -> dict[str, Any]:
    """Measure the link the sweep's ranks talk over (between the first two hosts, or loopback)."""
    hosts = settings.hosts
    if len(hosts) >= 2:
        placement = ["-H", f"{hosts[0].name}:1,{hosts[1].name}:1"]
        kind = "between hosts"
    elif hosts:
        placement = ["-H", f"{hosts[0].name}:2"]
        kind = "loopback"
    else:
        placement, kind = [], "loopback"
    argv = [python, "-m", "ringtrain", "run", "-np", "2", *placement, *settings.launcher_options,
            python, "-m", "ringtrain.bench.link"]
    log = out / "logs" / "link-probe.log"
    for _ in range(2):  # a second try: a start-up hiccup of the launcher should not cost the model
        code, wall, outputs, timed_out = execute(argv, {"PYTHONUNBUFFERED": "1", **settings.extra_env}, log,
                                                 min(settings.timeout_s, 600.0))
        found = [r for r in parse_output(outputs[0]) if "link_samples" in r]
        if code == 0 and found:
            break
    if code != 0 or not found:
        reason = "timed out" if timed_out else _failure_reason(log, code or 0)
        return {"error": f"link probe failed: {reason}; see {log.relative_to(out)}", "kind": kind}
    body = found[-1]
    try:
        fit = fit_link([(s, t) for s, t in body["link_samples"]], ranks=int(body.get("ranks", 2)))
    except ValueError as exc:
        return {"error": f"link probe: {exc}", "kind": kind}
    fit.hosts = list(body.get("hosts", []))
    fit.note = settings.link_note
    return {"kind": kind, **fit.as_dict(), "wall_seconds": wall, "log": str(log.relative_to(out))}


class SweepProgress:
    """A bar over the runs on a terminal; one line per finished run anywhere else."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self._bar: Any = None
        self._lines = enabled and not sys.stderr.isatty()
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc="bench", unit="run", dynamic_ncols=True, file=sys.stderr)

    def starting(self, run: RunSpec) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(run.label, refresh=True)

    def finished(self, run: RunSpec, m: Measurement) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._lines:
            what = (f"{m.items_per_second:,.1f} items/s" if m.items_per_second is not None
                    else f"{m.wall_seconds:.1f} s wall" if m.ok else f"FAILED: {m.error}")
            print(f"[{self.done}/{self.total}] {run.label}: {what}", flush=True)

    def write(self, message: str) -> None:
        """A line that does not break the bar."""
        if not message:
            return
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            say(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def say(message: str) -> None:
    """A status line for the user, on stderr (stdout holds the table)."""
    if message:
        print(message, file=sys.stderr, flush=True)


def measure_startup(settings: BenchSettings, threads: int, out: Path) -> dict[str, Any]:
    """A script that reported nothing: its start-up at every size (:mod:`ringtrain.bench.startup`).

    Returns ``{"seconds": {np: median}, "runs": [...]}``, or ``{"error": why}`` when it cannot be measured.
    """
    probes = startup_runs(settings, threads)
    if not probes:
        return {"error": "the command is not `python SCRIPT` or `python -m MODULE`, whose imports the "
                         "start-up probe repeats"}
    say(f"bench: the script reported nothing (no {TAG} line): measuring its start-up "
        f"({len(probes)} run(s) of its imports alone) to leave it out of the wall times")
    walls: dict[int, list[float]] = {}
    runs = []
    errors = []
    for probe in probes:
        log = out / "logs" / f"startup-{probe.index:03d}-np{probe.np}-r{probe.repeat + 1}.log"
        code, wall, _, timed_out = execute(probe.argv, probe.env, log, min(settings.timeout_s, 600.0),
                                           plain=probe.plain)
        runs.append({"np": probe.np, "repeat": probe.repeat, "exit_code": code, "wall_seconds": wall,
                     "log": str(log.relative_to(out)), "argv": list(probe.argv)})
        if code == 0:
            walls.setdefault(probe.np, []).append(wall)
        else:
            reason = "timed out" if timed_out else _failure_reason(log, code or 0)
            errors.append(f"np={probe.np}: {reason}; see {log.relative_to(out)}")
    result: dict[str, Any] = {"seconds": {n: statistics.median(w) for n, w in walls.items()}, "runs": runs,
                              "method": "wall time of the script's module-level imports (and, at more "
                                        "than one process, the process group's set-up), started as "
                                        "the script is"}
    if errors:
        result["error"] = "; ".join(errors[:3])
    return result


def run_sweep(settings: BenchSettings, progress: bool = True,
              on_result: Callable[[Measurement], None] | None = None) -> dict[str, Any]:
    """Check, measure the link, run everything; returns the result body (written by ``report``)."""
    cores = usable_cores()
    threads = settings.threads_per_process(cores)
    timing = check_workload(settings, threads)
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(settings, threads)
    body: dict[str, Any] = {"schema": "ringtrain.bench/1", "command": list(settings.argv),
                            "settings": settings.describe(), "threads_per_process": threads,
                            "machine": describe_machine(), "link": None, "runs": [], "interrupted": False}
    say(plan_line(settings, runs, timing, threads, cores))
    measurements: list[Measurement] = []
    bar = SweepProgress(len(runs), enabled=progress)
    startup: dict[int, float] = {}
    try:
        if settings.probes_link:
            if progress:
                print("bench: measuring the link (2 ranks, allreduce of 4 KiB..16 MiB) ...", file=sys.stderr,
                      flush=True)
            body["link"] = probe_link(settings, out)
        for run in runs:
            bar.starting(run)
            m = measure(run, out, settings.timeout_s)
            measurements.append(m)
            bar.finished(run, m)
            if run.index == 0 and m.wall_seconds is not None:
                bar.write(after_first_line(run, m.wall_seconds, runs[1:], settings, timing, threads, cores))
            if on_result is not None:
                on_result(m)
        silent = [m for m in measurements if m.ok and m.items_per_second is None]
        if settings.is_script and silent:
            body["startup"] = measure_startup(settings, threads, out)
            startup = {int(n): s for n, s in body["startup"].get("seconds", {}).items()}
    except KeyboardInterrupt:
        body["interrupted"] = True
    finally:
        bar.close()
    body["runs"] = [m.as_dict() for m in measurements]
    body["rows"] = [r.as_dict() for r in summarize(measurements, startup)]
    return body


def write_outputs(body: dict[str, Any], out: Path) -> list[str]:
    """Write scaling.json, scaling.csv and scaling.png into ``out``; returns notes for the user."""
    from ringtrain.bench.outputs import csv_text, write_atomic, write_json
    from ringtrain.bench.plot import write_plot

    write_json(body, out / "scaling.json")
    write_atomic(out / "scaling.csv", csv_text(body))
    notes = []
    why_not = write_plot(body, out / "scaling.png")
    if why_not:
        notes.append(why_not)
    return notes


def results_text(body: dict[str, Any]) -> str:
    """What the command prints after a sweep (and ``--replot``): the table, then the projection and
    the model's validation when the sweep asked for them (its settings in ``body``)."""
    from ringtrain.bench.outputs import projection_text, table_text, validation_text

    settings = body.get("settings", {})
    parts = ["\n", table_text(body)]
    projection = projection_text(body) if settings.get("project") else ""
    if projection:
        parts += ["\n", projection]
    validation = validation_text([{**v, "workload": settings.get("workload") or "script"}
                                  for v in body.get("validation", [])])
    if settings.get("validate") and not validation:
        validation = ("MODEL VALIDATION: none (the model needs a measured link and a row with a "
                      "measured efficiency: the link probe on, more than one process count)\n")
    if validation:
        parts += ["\n", validation]
    return "".join(parts) + "\n"


def run_bench(settings: BenchSettings, progress: bool = True) -> int:
    """The whole command: sweep, model, outputs, table; 0 when every run succeeded, else 1.

    A ``settings.out`` holding an earlier sweep is refused (UsageError) unless ``settings.overwrite``,
    before anything runs (:func:`ringtrain.bench.folder.prepare_out`)."""
    from ringtrain.bench.analysis import annotate
    from ringtrain.bench.folder import prepare_out

    say(prepare_out(settings.out, settings.overwrite) or "")
    body = run_sweep(settings, progress=progress)
    annotate(body, settings.interconnects, project=settings.project, validate=settings.validate)
    notes = write_outputs(body, settings.out)
    print(results_text(body), end="")
    written = ["scaling.json", "scaling.csv"] + ([] if notes else ["scaling.png"])
    print(f"wrote {', '.join(str(settings.out / name) for name in written)}")
    for note in notes:
        print(note)
    failed = [r for r in body["runs"] if r["status"] != "ok"]
    if body.get("interrupted"):
        return 130
    if failed:
        names = "; ".join(f"np={r['np']} {r['strategy']} #{r['repeat'] + 1}: {r['error']}"
                          for r in failed[:5])
        more = f" (and {len(failed) - 5} more)" if len(failed) > 5 else ""
        print(f"ringtrain bench: {len(failed)} of {len(body['runs'])} run(s) failed, the other rows are "
              f"kept: {names}{more}", file=sys.stderr)
        return 1
    return 0


def replot(folder: Path) -> int:
    """``--replot``: redraw ``folder/scaling.png`` from its ``scaling.json`` and print the table again,
    running nothing; 0 when the plot was written, 1 when it could not be (the message says why)."""
    from ringtrain.bench.folder import load_result
    from ringtrain.bench.plot import write_plot

    body = load_result(folder)
    try:
        text = results_text(body)
        print(text, end="")
        why_not = write_plot(body, folder / "scaling.png")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a hand-edited file: say what is off
        raise UsageError(f"--replot: {folder / 'scaling.json'} cannot be drawn or tabulated (a value is "
                         f"missing or wrong: {exc!r}). HINT: run the sweep again into that folder "
                         f"(ringtrain bench ... --out {folder} --overwrite).") from None
    if why_not:
        print(f"ringtrain bench: {why_not}", file=sys.stderr)
        return 1
    print(f"wrote {folder / 'scaling.png'}")
    return 0
