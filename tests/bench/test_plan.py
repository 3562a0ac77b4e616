"""Settings and planning: bad values are usage errors naming the fix; runs are interleaved."""

import json
from pathlib import Path

import pytest

from ringtrain.bench.plan import (
    BenchSettings,
    HostSpec,
    parse_np,
    parse_strategies,
    plan_runs,
    worker_spec,
)
from ringtrain.exceptions import UsageError


def test_np_is_sorted_and_deduplicated():
    assert parse_np("4,1,2,2") == (1, 2, 4)
    assert parse_np(" 1 , 8 ") == (1, 8)


@pytest.mark.parametrize(("text", "message"), [
    ("0,2", "--np 0,2: 0 processes"),
    ("1,x", "--np 1,x: 'x' is not a whole number"),
    ("-1", "--np -1"),
    (",", "lists no process count"),
])
def test_bad_np_names_the_value_and_the_fix(text, message):
    with pytest.raises(UsageError) as info:
        parse_np(text)
    assert message in str(info.value)
    assert "HINT: " in str(info.value)


def test_strategies_keep_order_and_refuse_unknown_names():
    assert parse_strategies("horovod,single,horovod") == ("horovod", "single")
    with pytest.raises(UsageError, match="'hvd' is not a strategy.*HINT"):
        parse_strategies("single,hvd")


@pytest.mark.parametrize(("name", "trainer", "compression", "sync_every", "outer", "label"), [
    ("single", "ddp", "none", None, (1.0, 0.0), "fp32"),
    ("ddp", "ddp", "none", None, (1.0, 0.0), "fp32"),
    ("horovod", "horovod", "none", None, (1.0, 0.0), "fp32"),
    ("ddp-fp16", "ddp", "fp16", None, (1.0, 0.0), "fp16"),
    ("horovod-fp16", "horovod", "fp16", None, (1.0, 0.0), "fp16"),
    ("horovod-bf16", "horovod", "bf16", None, (1.0, 0.0), "bf16"),
    ("ddp-powersgd4", "ddp", "powersgd:4", None, (1.0, 0.0), "powersgd:4"),
    ("horovod-powersgd8", "horovod", "powersgd:8", None, (1.0, 0.0), "powersgd:8"),
    ("horovod-localsgd8", "horovod", "none", 8, (1.0, 0.0), "localsgd:8"),
    ("ddp-localsgd16", "ddp", "none", 16, (1.0, 0.0), "localsgd:16"),
    ("horovod-diloco8", "horovod", "none", 8, (0.7, 0.9), "localsgd:8"),
    ("barrier", "horovod", "none", None, (1.0, 0.0), "fp32"),
])
def test_a_strategy_name_says_what_the_trainer_runs(name, trainer, compression, sync_every, outer, label):
    from ringtrain.bench.plan import strategy_spec

    spec = strategy_spec(name)
    assert spec.name == name
    assert (spec.trainer, spec.compression, spec.sync_every) == (trainer, compression, sync_every)
    assert (spec.outer_lr, spec.outer_momentum) == outer
    assert spec.method.label == label
    assert spec.trainer_settings() == {"strategy": trainer, "compression": compression,
                                       "sync_every": sync_every, "outer_lr": outer[0],
                                       "outer_momentum": outer[1]}


def test_powersgd_without_a_rank_is_rank_4_and_names_are_shown_with_it():
    assert parse_strategies("horovod-powersgd,horovod-powersgd4,ddp-powersgd08") == (
        "horovod-powersgd4", "ddp-powersgd8")


@pytest.mark.parametrize(("name", "message"), [
    ("horovod-powersgd0", "'horovod-powersgd0': PowerSGD's rank must be at least 1. HINT: write e.g. "
                          "horovod-powersgd4"),
    ("ddp-localsgd", "'ddp-localsgd': -localsgd needs the steps between two averagings, at least 1 (none "
                     "given). HINT: write e.g. ddp-localsgd8"),
    ("horovod-diloco0", "'horovod-diloco0': -diloco needs the steps between two averagings"),
    ("foo", "'foo' is not a strategy. HINT: choose from single, ddp, horovod"),
    ("horovod-", "'horovod-' is not a strategy. HINT"),
    ("horovod-fp8", "'horovod-fp8': -fp8 is not a suffix of horovod. HINT"),
    ("ddp-fp1616", "'ddp-fp1616': -fp16 takes no number. HINT: write ddp-fp16."),
    ("single-fp16", "'single' is the single-process baseline. HINT: write ddp-fp16 or horovod-fp16."),
    ("barrier-powersgd4", "'barrier' is a reference that exchanges no gradients"),
])
def test_a_malformed_strategy_is_a_usage_error_naming_it_and_the_fix(name, message):
    with pytest.raises(UsageError) as info:
        parse_strategies(f"single,{name}")
    assert f"--strategies single,{name}: " in str(info.value)
    assert message in str(info.value)
    assert "HINT: " in str(info.value)
    with pytest.raises(UsageError, match="HINT"):  # settings built without the parser refuse it too
        BenchSettings(workload="mnist", strategies=("single", name))


def test_method_of_a_name_and_of_what_is_no_strategy():
    from ringtrain.bench.plan import method_of

    assert method_of("horovod-localsgd4").sync_every == 4
    assert method_of("ddp-fp16").name == "fp16"
    assert method_of("script") is None  # a script's competitor: its exchange is its own business
    assert method_of("horovod-zstd") is None  # a name of another version in an old result file


def test_powersgd_warms_up_past_its_uncompressed_steps_and_local_sgd_times_whole_periods():
    from ringtrain.bench.plan import POWERSGD_PLAIN_STEPS, POWERSGD_WARMUP

    assert POWERSGD_WARMUP >= POWERSGD_PLAIN_STEPS + 2
    settings = BenchSettings(workload="mnist", nps=(1, 2), steps=50, warmup_steps=5,
                             strategies=("single", "horovod", "ddp-powersgd4", "horovod-localsgd8",
                                         "horovod-diloco16"))
    assert settings.steps_of("single") == (5, 50)
    assert settings.steps_of("horovod") == (5, 50)
    assert settings.steps_of("ddp-powersgd4") == (12, 50)
    assert settings.steps_of("horovod-localsgd8") == (5, 56)  # 7 whole periods of 8
    assert settings.steps_of("horovod-diloco16") == (5, 64)
    more = BenchSettings(workload="mnist", steps=48, warmup_steps=20, strategies=("ddp-powersgd4",
                                                                                  "horovod-localsgd8"))
    assert more.steps_of("ddp-powersgd4") == (20, 48)  # a longer warm-up stays as asked
    assert more.steps_of("horovod-localsgd8") == (20, 48)  # already whole periods
    epochs = BenchSettings(workload="mnist", epochs=1, strategies=("horovod-localsgd8", "horovod-powersgd4"))
    assert epochs.steps_of("horovod-localsgd8") == (5, None)  # whole epochs are timed instead
    assert epochs.steps_of("horovod-powersgd4") == (12, None)
    spec = worker_spec(settings, "horovod-localsgd8", 2, threads=1)
    assert (spec["steps"], spec["warmup_steps"], spec["sync_every"]) == (56, 5, 8)
    spec = worker_spec(settings, "ddp-powersgd4", 2, threads=1)
    assert (spec["steps"], spec["warmup_steps"], spec["compression"]) == (50, 12, "powersgd:4")
    planned = settings.describe()["strategy_settings"]
    assert planned["ddp-powersgd4"] == {"strategy": "ddp", "compression": "powersgd:4", "sync_every": None,
                                        "outer_lr": 1.0, "outer_momentum": 0.0, "method": "powersgd:4",
                                        "warmup_steps": 12, "steps": 50}
    assert planned["horovod-diloco16"]["outer_momentum"] == 0.9
    assert BenchSettings(command=("python", "x.py")).describe()["strategy_settings"] == {}


def test_the_plans_uncompressed_steps_are_powersgds():
    """The warm-up rule copies PowerSGD's default start_iter (plan.py stays torch-free): they must agree."""
    from ringtrain.bench.plan import POWERSGD_PLAIN_STEPS
    from ringtrain.powersgd import PowerSGDConfig
    from ringtrain.train.ddp_hooks import DEFAULT_START_ITER

    assert PowerSGDConfig().start_iter == POWERSGD_PLAIN_STEPS
    assert DEFAULT_START_ITER == POWERSGD_PLAIN_STEPS


def test_the_estimate_counts_each_strategys_own_steps():
    from ringtrain.bench.estimate import WorkloadTiming, run_seconds

    settings = BenchSettings(workload="mnist", nps=(1, 2), steps=50, warmup_steps=5, repeats=1,
                             strategies=("horovod", "horovod-powersgd4", "horovod-localsgd8"))
    timing = WorkloadTiming(items=60000, batch=64, load_s=0.0, step_s=0.01, import_s=0.0)
    runs = {r.strategy: r for r in plan_runs(settings, threads=1, python="PY")}
    base = run_seconds(settings, runs["horovod"], timing, threads=1, cores=2)
    assert run_seconds(settings, runs["horovod-powersgd4"], timing, 1, 2) == pytest.approx(base + 7 * 0.01)
    assert run_seconds(settings, runs["horovod-localsgd8"], timing, 1, 2) == pytest.approx(base + 6 * 0.01)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"steps": 5, "epochs": 1}, "--steps 5 and --epochs 1"),
    ({"repeats": 0}, "--repeats 0"),
    ({"steps": 0}, "--steps 0"),
    ({"scaling": "huge"}, "--scaling 'huge'"),
    ({"nps": (1, 3), "hosts": (HostSpec("a", 1), HostSpec("b", 1))}, "3 processes do not fit the 2 slots"),
    ({"nps": (1, 3), "scaling": "strong", "batch_size": 64}, "does not split evenly over 3"),
    ({"workload": None, "command": ("python", "x.py"), "steps": 5}, "--steps"),
    ({"workload": None, "command": ()}, "nothing to benchmark"),
])
def test_settings_refuse_what_cannot_work(kwargs, message):
    base = {"workload": "mnist", "nps": (1, 2)}
    with pytest.raises(UsageError) as info:
        BenchSettings(**{**base, **kwargs})
    assert message in str(info.value)
    assert "HINT: " in str(info.value)


def test_runs_are_interleaved_repeat_by_repeat():
    settings = BenchSettings(workload="mnist", nps=(1, 2, 4), strategies=("single", "ddp", "horovod"),
                             repeats=2, steps=10)
    runs = plan_runs(settings, threads=1, python="PY")
    order = [(r.repeat, r.strategy, r.np) for r in runs]
    one_repeat = [("single", 1), ("ddp", 2), ("horovod", 2), ("ddp", 4), ("horovod", 4)]
    assert order == [(0, s, n) for s, n in one_repeat] + [(1, s, n) for s, n in one_repeat]
    assert [r.index for r in runs] == list(range(len(runs)))


def test_baseline_is_a_plain_process_and_others_go_through_the_launcher():
    settings = BenchSettings(workload="mnist", nps=(2,), strategies=("horovod-fp16",), repeats=1,
                             hosts=(HostSpec("hostA", 1), HostSpec("hostB", 1)),
                             launcher_options=("-i", "key"))
    base, dist = plan_runs(settings, threads=3, python="PY")
    assert base.strategy == "single"
    assert base.np == 1
    assert base.argv[:3] == ("PY", "-m", "ringtrain.bench.worker")
    assert dist.argv[:9] == ("PY", "-m", "ringtrain", "run", "-np", "2", "-H", "hostA:1,hostB:1", "-i")
    spec = json.loads(dist.argv[dist.argv.index("--spec") + 1])
    assert spec["strategy"] == "horovod"
    assert spec["compression"] == "fp16"
    assert spec["threads"] == 3
    assert base.env["OMP_NUM_THREADS"] == "3"
    assert dist.env["OMP_NUM_THREADS"] == "3"


def test_the_barrier_reference_is_one_job_through_the_launcher():
    settings = BenchSettings(workload="mnist", nps=(1, 2), strategies=("barrier", "horovod"), repeats=1)
    _, barrier, horovod = plan_runs(settings, threads=1, python="PY")
    assert barrier.strategy == "barrier"
    assert barrier.copies == 1
    assert not barrier.plain
    assert barrier.argv[:6] == ("PY", "-m", "ringtrain", "run", "-np", "2")
    spec = json.loads(barrier.argv[barrier.argv.index("--spec") + 1])
    assert (spec["strategy"], spec["bench_strategy"], spec["compression"]) == ("horovod", "barrier", "none")
    assert horovod.strategy == "horovod"


def test_independent_copies_and_user_commands():
    settings = BenchSettings(workload="mnist", nps=(1, 2), strategies=("independent",), repeats=1)
    _, copies = plan_runs(settings, threads=1, python="PY")
    assert copies.copies == 2
    assert copies.argv[0] == "PY"
    script = BenchSettings(command=("python", "train.py", "--lr", "1"), nps=(1, 2), repeats=1)
    base, dist = plan_runs(script, threads=1, python="PY")
    # the baseline's python is the bench's own, as ringtrain run makes its ranks' (worker_entry.py)
    assert base.argv == ("PY", "train.py", "--lr", "1")
    assert dist.argv[-4:] == ("python", "train.py", "--lr", "1")
    assert "run" in dist.argv
    assert dist.strategy == "script"


def test_strong_scaling_splits_the_batch():
    settings = BenchSettings(workload="mnist", nps=(1, 2, 4), scaling="strong", batch_size=64)
    assert worker_spec(settings, "ddp", 4, threads=1)["batch_size"] == 16
    assert worker_spec(BenchSettings(workload="mnist", batch_size=64), "ddp", 4, 1)["batch_size"] == 64


def test_threads_default_to_cores_shared_by_the_most_local_ranks():
    assert BenchSettings(workload="mnist", nps=(1, 2)).threads_per_process(cores=8) == 4
    assert BenchSettings(workload="mnist", nps=(1, 4), threads=2).threads_per_process(cores=8) == 2
    on_hosts = BenchSettings(workload="mnist", nps=(1, 4), hosts=(HostSpec("a", 2), HostSpec("b", 2)))
    assert on_hosts.threads_per_process(cores=8) == 4
    assert BenchSettings(workload="mnist", nps=(1, 16)).threads_per_process(cores=2) == 1


def test_describe_is_plain_json():
    body = BenchSettings(workload="mnist", out=Path("x")).describe()
    assert json.loads(json.dumps(body))["np"] == [1, 2]


def test_plain_runs_lose_the_variables_that_make_a_rank():
    from ringtrain.bench.plan import plain_environment

    environ = {"PATH": "/bin", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "RANK": "1", "WORLD_SIZE": "2",
               "MASTER_ADDR": "x", "OMPI_COMM_WORLD_RANK": "0", "HOROVOD_RANK": "0", "OMP_NUM_THREADS": "1"}
    assert plain_environment(environ) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    settings = BenchSettings(workload="mnist", nps=(1, 2), strategies=("independent", "ddp"), repeats=1)
    assert [r.plain for r in plan_runs(settings, threads=1)] == [True, True, False]


def test_a_scripts_baseline_runs_with_the_horovod_shim(monkeypatch):
    """ringtrain run puts the shim on its ranks' PYTHONPATH; the plain baseline needs it just as much."""
    import ringtrain.shim
    from ringtrain.shim import SHIM_DIR

    monkeypatch.setattr(ringtrain.shim, "real_horovod_importable", lambda: False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    settings = BenchSettings(command=("python", "hvd_train.py"), nps=(1, 2), repeats=1)
    base, launched = plan_runs(settings, threads=1)
    assert base.plain
    assert base.env["PYTHONPATH"].split(":") == [str(SHIM_DIR), "/elsewhere"]
    assert "PYTHONPATH" not in launched.env  # ringtrain run adds it for its ranks
    # a built-in workload's baseline imports no horovod: its environment stays as it was
    builtin = plan_runs(BenchSettings(workload="mnist", nps=(1, 2), repeats=1), threads=1)
    assert all("PYTHONPATH" not in run.env for run in builtin)
    # real Horovod installed: it wins, as under ringtrain run
    monkeypatch.setattr(ringtrain.shim, "real_horovod_importable", lambda: True)
    assert "PYTHONPATH" not in plan_runs(settings, threads=1)[0].env


def test_start_up_probes_run_like_the_script_at_every_size(monkeypatch):
    import ringtrain.shim
    from ringtrain.bench.plan import STARTUP, startup_runs

    monkeypatch.setattr(ringtrain.shim, "real_horovod_importable", lambda: False)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # a shim already there would not be added again
    settings = BenchSettings(command=("python", "train.py", "--epochs", "1"), nps=(2, 4), repeats=2)
    probes = startup_runs(settings, threads=1, python="PY")
    assert [(p.np, p.repeat) for p in probes] == [(1, 0), (2, 0), (4, 0), (1, 1), (2, 1), (4, 1)]
    assert {p.strategy for p in probes} == {STARTUP}
    one, two = probes[0], probes[1]
    assert one.plain
    assert one.argv == ("PY", "-m", "ringtrain.bench.startup", "train.py", "--epochs", "1")
    assert "PYTHONPATH" in one.env  # with the shim, as the baseline
    assert two.argv[:6] == ("PY", "-m", "ringtrain", "run", "-np", "2")
    assert two.argv[-5:] == one.argv[-5:]
    assert startup_runs(BenchSettings(command=("./train.sh",), repeats=1), threads=1) == []


def test_the_link_is_probed_only_for_the_model():
    assert not BenchSettings(workload="mnist").probes_link
    assert BenchSettings(workload="mnist", project=True).probes_link
    assert BenchSettings(workload="mnist", validate=True).probes_link
    assert not BenchSettings(workload="mnist", validate=True, link_probe=False).probes_link
    described = BenchSettings(workload="mnist", project=True).describe()
    assert described["project"] is True
    assert described["validate"] is False


def test_every_run_of_a_sweep_tells_its_processes_that_ringtrain_bench_reads_their_reports():
    """ringtrain.bench.report prints only under RINGTRAIN_BENCH=1: every kind of run carries it."""
    from ringtrain.bench.hook import ENV_VAR
    from ringtrain.bench.plan import startup_runs

    script = BenchSettings(command=("python", "train.py"), nps=(1, 2), repeats=2)
    builtin = BenchSettings(workload="mnist", nps=(1, 2), strategies=("single", "independent", "horovod"),
                            repeats=1)
    runs = [*plan_runs(script, threads=1), *plan_runs(builtin, threads=1), *startup_runs(script, threads=1)]
    assert {run.strategy for run in runs} == {"single", "script", "independent", "horovod", "startup"}
    assert all(run.env[ENV_VAR] == "1" for run in runs)


def test_a_plain_run_keeps_a_program_that_is_not_python():
    script = BenchSettings(command=("./train.sh", "--lr", "1"), nps=(1, 2), repeats=1)
    base, dist = plan_runs(script, threads=1, python="PY")
    assert base.argv == ("./train.sh", "--lr", "1")
    assert dist.argv[-3:] == ("./train.sh", "--lr", "1")
