"""Result bodies built by hand, as a sweep would write them, for the report and model tests."""

from typing import Any

from ringtrain.bench.records import Measurement, combine_reports, summarize


def report(rank: int, world: int, items: float, seconds: float, host: str = "h0",
           **extra: Any) -> dict[str, Any]:
    return {"items": items, "seconds": seconds, "rank": rank, "world_size": world, "host": host, "steps": 10,
            "threads": 1, "cores": 2, "gradient_bytes": 1_572_864, **extra}


def measurement(index: int, strategy: str, np: int, repeat: int, rate_per_rank: float, ok: bool = True,
                hosts: tuple[str, ...] = ()) -> Measurement:
    """A run whose every rank trained ``rate_per_rank`` items/s for 1 s."""
    m = Measurement(index=index, repeat=repeat, strategy=strategy, np=np, wall_seconds=5.0 + np)
    if not ok:
        m.status, m.error, m.exit_code = "failed", "boom (exit code 1)", 1
        return m
    extra = {"phases": {"forward": 0.03, "backward": 0.06, "optimizer": 0.01}} if strategy == "single" else {}
    combine_reports(m, [report(r, np, rate_per_rank, 1.0, host=(hosts[r] if hosts else "h0"), **extra)
                        for r in range(np)])
    return m


def body(measurements: list[Measurement], link: dict[str, Any] | None = None,
         strategies: tuple[str, ...] = ("single", "ddp", "horovod-fp16")) -> dict[str, Any]:
    return {"schema": "ringtrain.bench/1", "settings": {"workload": "mnist", "scaling": "weak", "np": [1, 2],
                                                        "strategies": list(strategies), "steps": 10,
                                                        "warmup_steps": 2, "repeats": 2, "command": []},
            "machine": {"cpu": "Test CPU", "cores": 2, "memory_bytes": 2**30, "gpus": [], "torch": "t",
                        "ringtrain": "r", "commit": None, "date": "today"},
            "threads_per_process": 1, "link": link, "runs": [m.as_dict() for m in measurements],
            "rows": [r.as_dict() for r in summarize(measurements)], "interrupted": False}


def sample_body(link: bool = True) -> dict[str, Any]:
    ms = [measurement(0, "single", 1, 0, 100.0), measurement(1, "ddp", 2, 0, 80.0),
          measurement(2, "horovod-fp16", 2, 0, 90.0), measurement(3, "single", 1, 1, 100.0),
          measurement(4, "ddp", 2, 1, 70.0, ok=False), measurement(5, "horovod-fp16", 2, 1, 95.0)]
    probe = {"kind": "loopback", "alpha_s": 1e-4, "beta_bytes_per_s": 1e8, "samples": [],
             "hosts": ["h0", "h0"], "note": "test link"} if link else None
    return body(ms, probe)


#: A small model's trainable parameter shapes (as the baseline's worker lists them): two matrices that
#: PowerSGD compresses at rank 4, and biases that travel as they are.
SHAPES = [[256, 1024], [256], [64, 256], [64]]
METHOD_STRATEGIES = ("single", "horovod", "horovod-powersgd4", "horovod-localsgd8")


def method_sweep(link: bool = True, shapes: bool = True) -> dict[str, Any]:
    """A sweep of fp32, PowerSGD and Local SGD competitors at 2 processes, its runs reporting what the
    worker reports (wire bytes, method, warm-up); ``shapes=False``: as a result file written before the
    baseline listed its parameters' shapes."""
    from ringtrain.bench.plan import BenchSettings
    from ringtrain.exchange import Method, local_sgd, wire_cost

    methods = {"horovod": Method("none"), "horovod-powersgd4": Method("powersgd", rank=4),
               "horovod-localsgd8": local_sgd(8)}
    rates = {"single": 100.0, "horovod": 80.0, "horovod-powersgd4": 90.0, "horovod-localsgd8": 95.0}
    runs = []
    for index, strategy in enumerate(METHOD_STRATEGIES):
        np = 1 if strategy == "single" else 2
        m = Measurement(index=index, repeat=0, strategy=strategy, np=np, wall_seconds=5.0 + np)
        extra: dict[str, Any] = {"warmup_steps": 12 if "powersgd" in strategy else 5}
        if strategy == "single":
            extra["phases"] = {"forward": 0.03, "backward": 0.06, "optimizer": 0.01}
            if shapes:
                extra["parameter_shapes"] = SHAPES
        else:
            cost = wire_cost(SHAPES, methods[strategy])
            extra.update(wire_bytes_per_step=cost.bytes_per_step, compression_ratio=cost.ratio,
                         method=methods[strategy].label)
        combine_reports(m, [report(r, np, rates[strategy], 1.0, **{**extra, "gradient_bytes": 1_115_392})
                            for r in range(np)])
        runs.append(m)
    probe = {"kind": "loopback", "alpha_s": 1e-4, "beta_bytes_per_s": 1e8, "samples": [],
             "hosts": ["h0", "h0"], "note": "test link"} if link else None
    result = body(runs, probe, strategies=METHOD_STRATEGIES)
    planned = BenchSettings(workload="mnist", strategies=METHOD_STRATEGIES, steps=10, warmup_steps=5)
    result["settings"].update(warmup_steps=5, strategy_settings=planned.strategy_settings())
    return result
