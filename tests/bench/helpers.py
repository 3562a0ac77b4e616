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
