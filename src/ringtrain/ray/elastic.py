"""``ElasticRayExecutor``: accepted for Horovod's scripts, refused when built (not supported yet).

Its settings are read and checked as Horovod's were, so that a script fails at one clear line (the
constructor), naming what works today instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ElasticRaySettings:
    """What ``ElasticRayExecutor.create_settings`` was given."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    elastic_timeout: float = 600
    timeout_s: float = 30
    nics: Any = None
    verbose: int = 1
    override_discovery: bool = True


class ElasticRayExecutor:
    """Horovod's elastic Ray executor: not supported yet; the constructor says what to use instead."""

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None,
                        reset_limit: int | None = None,
                        cooldown_range: tuple[int, int] | None = None, elastic_timeout: float = 600,
                        timeout_s: float = 30, ssh_identity_file: str | None = None, nics: Any = None,
                        verbose: int = 1, **_ignored: Any) -> ElasticRaySettings:
        """Settings of an elastic job (``ssh_identity_file`` and other ssh options are ignored)."""
        if isinstance(min_num_proc, bool) or not isinstance(min_num_proc, int) or min_num_proc < 1:
            raise ValueError(f"min_num_proc={min_num_proc!r} must be a whole number of at least 1.")
        if max_num_proc is not None and max_num_proc < min_num_proc:
            raise ValueError(f"max_num_proc={max_num_proc} is below min_num_proc={min_num_proc}.")
        return ElasticRaySettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                                  reset_limit=reset_limit,
                                  cooldown_range=cooldown_range, elastic_timeout=elastic_timeout,
                                  timeout_s=timeout_s, nics=nics, verbose=verbose)

    def __init__(self, settings: ElasticRaySettings | None = None, env_vars: dict[str, str] | None = None,
                 use_gpu: bool = False, cpus_per_slot: int = 1, gpus_per_slot: int | None = None,
                 override_discovery: bool = True, **_ignored: Any) -> None:
        raise NotImplementedError(
            "ElasticRayExecutor is not supported by ringtrain yet. HINT: use RayExecutor(settings, "
            "num_workers=N) for a fixed-size job on Ray, or `ringtrain run --min-np N --max-np M` on a host "
            "list for an elastic one (docs/ray.md, docs/elastic.md).")
