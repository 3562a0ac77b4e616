"""The sweep's estimate: said before it starts, labelled as an estimate, rescaled after the first run."""

import pytest

from ringtrain.bench import estimate
from ringtrain.bench.estimate import WorkloadTiming, after_first_line, duration, plan_line, sweep_seconds
from ringtrain.bench.plan import BenchSettings, plan_runs


def test_duration_reads_naturally():
    assert duration(45) == "45 s"
    assert duration(300) == "5.0 min"
    assert duration(7200) == "2.0 h"


def test_a_built_in_sweep_is_estimated_from_the_plan():
    settings = BenchSettings(workload="mnist", nps=(1, 2), strategies=("single", "horovod"), steps=40,
                             warmup_steps=5, repeats=3, link_probe=False)
    runs = plan_runs(settings, threads=1)
    timing = WorkloadTiming(items=10_000, batch=64, load_s=2.0, step_s=0.1)
    # 3 baselines: start-up 3 s of imports (the default) + 2 s loading, then (45 + 5 phase) steps x 0.1 s;
    # 3 launched: the ranks' 3 + 2 s, the launcher's 3 s, 2 s rendezvous, then 45 x 0.1 s
    # (2 ranks x 1 thread on 2 cores: no slow-down)
    expected = 3 * (5.0 + 5.0) + 3 * (10.0 + 4.5)
    assert sweep_seconds(settings, runs, timing, threads=1, cores=2) == pytest.approx(expected)
    line = plan_line(settings, runs, timing, threads=1, cores=2)
    assert "estimate (not a measurement)" in line
    assert "6 run(s)" in line
    assert "100.0 ms a step, measured here" in line
    assert "3 s to import torch and the Trainer, a default" in line
    timing.import_s = 6.0  # measured: the start-up of every run grows with it
    more = 3 * 3 + 3 * 6  # 3 s more for each baseline, twice that for each launched run
    assert sweep_seconds(settings, runs, timing, threads=1, cores=2) == pytest.approx(expected + more)
    assert "6.0 s to import torch and the Trainer, measured" in plan_line(settings, runs, timing, 1, 2)
    timing.import_s = None
    # oversubscribed: 2 ranks x 2 threads on 2 cores take twice as long a step
    assert sweep_seconds(settings, runs, timing, threads=2, cores=2) > expected


def test_an_unmeasured_step_uses_the_default_and_says_so():
    settings = BenchSettings(workload="mnist", nps=(1, 2), repeats=1, link_probe=False)
    runs = plan_runs(settings, threads=1)
    line = plan_line(settings, runs, WorkloadTiming(items=100, batch=64, load_s=0.0, step_s=None), 1, 2)
    assert f"{estimate.DEFAULT_STEP_S * 1000:.0f} ms a step, a default" in line


def test_a_script_is_estimated_after_its_first_run():
    settings = BenchSettings(command=("python", "train.py"), nps=(1, 2), repeats=2, link_probe=False)
    runs = plan_runs(settings, threads=1)
    assert "estimated after the first run" in plan_line(settings, runs, None, 1, 2)
    line = after_first_line(runs[0], 30.0, runs[1:], settings, None, 1, 2)
    # the other 3 runs: one more baseline (30 s), two launched (30 s + the launcher's overhead)
    assert f"about {duration(90 + 2 * estimate.LAUNCH_OVERHEAD_S)}" in line
    assert "the first run took 30 s" in line


def test_the_first_run_rescales_a_built_in_estimate():
    settings = BenchSettings(workload="mnist", nps=(1, 2), strategies=("single", "horovod"), repeats=1,
                             link_probe=False)
    runs = plan_runs(settings, threads=1)
    timing = WorkloadTiming(items=10_000, batch=64, load_s=0.0, step_s=0.1)
    first = estimate.run_seconds(settings, runs[0], timing, 1, 2)
    rest = estimate.run_seconds(settings, runs[1], timing, 1, 2)
    line = after_first_line(runs[0], 2 * first, runs[1:], settings, timing, 1, 2)
    assert f"about {duration(2 * rest)}" in line
    assert "x 2.00" in line


def test_the_import_timer_times_a_fresh_interpreter():
    import sys

    seconds = estimate.import_seconds(estimate.start_import_timer(sys.executable))
    assert seconds is not None
    assert seconds > 0
    assert estimate.import_seconds(estimate.start_import_timer("/no/such/python")) is None
