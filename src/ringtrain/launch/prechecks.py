"""What the launcher checks before any rank starts.

A rank that finds a problem for itself finds it seconds later (after the rendezvous), once per rank,
with a traceback each. What the launcher can see as well is checked here, once: a device that is not
there (``--device cuda`` where torch sees no GPU), a timeline file rank 0 cannot write, and more threads
than cores on this machine (a warning: it runs, only slower, and its timings do not show scaling).

Only what holds for this machine is checked here: a timeline only when rank 0 runs here, cores only
for the ranks started here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ringtrain.env.cores import usable_cores
from ringtrain.exceptions import UsageError
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.plan import NodePlan, resolve_plan

TIMELINE = "HOROVOD_TIMELINE"
#: Set to 1 (or pass ``--oversubscribe``) to run more threads than cores without a warning.
OVERSUBSCRIBE_VARIABLE = "RINGTRAIN_OVERSUBSCRIBE"


#: The one line a missing ``ray`` package gets.
NO_RAY = "--ray needs Ray, which is not installed here. HINT: pip install 'ringtrain[ray]'"


def require_ray() -> None:
    """A usage error (exit 2) naming the pip command when the ``ray`` package cannot be imported."""
    try:
        import ray  # noqa: F401 - imported for the check; the job imports it again where used
    except ImportError:
        raise UsageError(NO_RAY) from None


def check_device(device: str | None, flag: str = "--device") -> None:
    """Refuse ``cuda`` where torch sees no CUDA device (UsageError naming the fix)."""
    if device != "cuda":
        return
    import torch  # only here: the other checks and the commands that start nothing must not pay for it

    if torch.cuda.is_available():
        return
    if torch.version.cuda is None:
        why = f"this torch ({torch.__version__}) is built without CUDA"
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        hidden = f", and CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
        why = f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU{hidden}"
    raise UsageError(f"{flag} cuda: no CUDA device here ({why}). HINT: use {flag} cpu, or leave {flag} out "
                     "(CUDA where there is a GPU, else CPU).")


def timeline_problem(value: str, source: str) -> str | None:
    """Why rank 0 could not write the timeline file ``value`` (None when it can, or when it is not a file).

    ``source`` names where the value came from (``HOROVOD_TIMELINE=...``, ``--timeline-filename ...``).
    """
    if not value or value == "DYNAMIC":
        return None
    path = Path(value)
    folder = path.parent
    fix = "name a file in an existing, writable folder, or unset HOROVOD_TIMELINE"
    if path.is_dir() or value.endswith(("/", os.sep)):
        return f"{source} names a folder, not a file. HINT: {fix} (e.g. {path / 'timeline.json'})."
    if not folder.is_dir():
        return (f"{source}: rank 0 could not write the timeline: the folder {folder} does not exist. "
                f"HINT: create it (mkdir -p {folder}), or {fix}.")
    cannot = f"{source}: rank 0 could not write the timeline:"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{cannot} the folder {folder} is not writable. HINT: {fix}."
    if path.exists() and not os.access(path, os.W_OK):
        return f"{cannot} {path} is not writable. HINT: {fix}."
    return None


def timeline_setting(config: LaunchConfig, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The workers' ``HOROVOD_TIMELINE`` and where it comes from, or None when it is not set.

    The precedence is the workers': ``-x`` over ``--timeline-filename`` over the launcher's environment.
    """
    if TIMELINE in config.exports:
        exported = config.exports[TIMELINE]
        if exported is None:  # -x HOROVOD_TIMELINE: the launcher's own value
            return (environ[TIMELINE], f"{TIMELINE}={environ[TIMELINE]}") if TIMELINE in environ else None
        return exported, f"-x {TIMELINE}={exported}"
    if TIMELINE in config.tuning:
        return config.tuning[TIMELINE], f"--timeline-filename {config.tuning[TIMELINE]}"
    if TIMELINE in environ:
        return environ[TIMELINE], f"{TIMELINE}={environ[TIMELINE]}"
    return None


def check_timeline(config: LaunchConfig, environ: Mapping[str, str]) -> None:
    """Refuse a timeline rank 0 cannot write (UsageError); call it only when rank 0 runs on this machine."""
    setting = timeline_setting(config, environ)
    if setting is not None:
        problem = timeline_problem(*setting)
        if problem is not None:
            raise UsageError(problem)


def oversubscription_warning(ranks: int, threads_per_rank: int, cores: int, silence: str) -> str | None:
    """A warning when ``ranks`` x ``threads_per_rank`` exceed ``cores`` (None otherwise).

    ``silence`` says how to turn the warning off (a flag, a variable).
    """
    threads = ranks * threads_per_rank
    if ranks < 2 or threads <= cores:
        return None
    per_rank = f"{threads_per_rank} thread{'s' if threads_per_rank != 1 else ''} each"
    fewer = f"-np {cores} or fewer" if ranks > cores else "fewer threads per rank"
    return (f"{ranks} ranks x {per_rank} = {threads} threads on {cores} cores: the ranks take turns on the "
            "cores, so each step is slower than with fewer ranks and the timings do not show scaling. "
            f"HINT: use {fewer}; {silence} silences this warning.")


@dataclass(frozen=True)
class OnThisMachine:
    """What of a job runs on the machine of this launcher."""

    ranks: int
    """Ranks started here."""
    has_rank_0: bool
    """Whether global rank 0 (which writes the timeline) runs here."""


def on_this_machine(config: LaunchConfig, environ: Mapping[str, str]) -> OnThisMachine | None:
    """The ranks this launcher starts here, or None when it starts them elsewhere (hosts, srun)."""
    if config.elastic:
        if config.hosts or config.host_discovery_script:
            return None
        return OnThisMachine(ranks=config.num_proc or config.min_np or 1, has_rank_0=True)
    try:
        plan = resolve_plan(config, environ)
    except UsageError:
        return None  # the launch reports it, in its own words
    if not isinstance(plan, NodePlan):
        return None
    # with a static rendezvous node 0 holds rank 0; an elastic one hands out node ranks as nodes arrive
    rank_0 = plan.local_only or (plan.node_rank == 0 and plan.rdzv_backend == "static")
    return OnThisMachine(ranks=plan.nproc, has_rank_0=rank_0)


def threads_per_rank(config: LaunchConfig, environ: Mapping[str, str], ranks: int) -> int:
    """``OMP_NUM_THREADS`` of the workers: given (``-x`` or the environment), else 1 when ranks share a
    machine (what the launcher sets), else every core."""
    given = config.exports.get("OMP_NUM_THREADS") or environ.get("OMP_NUM_THREADS", "")
    if given.strip().isdigit() and int(given) > 0:
        return int(given)
    return 1 if ranks > 1 else usable_cores()


def before_launch(config: LaunchConfig, environ: Mapping[str, str] | None = None,
                  oversubscribe: bool = False) -> list[str]:
    """Check ``config`` before a ``ringtrain run`` starts any rank.

    Raises UsageError for what would fail in the ranks; returns the warnings to print (each once).
    """
    environ = os.environ if environ is None else environ
    here = on_this_machine(config, environ)
    if here is None:
        return []
    if here.has_rank_0:
        check_timeline(config, environ)
    warning = None
    if not oversubscribe:
        warning = oversubscription_warning(here.ranks, threads_per_rank(config, environ, here.ranks),
                                           usable_cores(), f"--oversubscribe ({OVERSUBSCRIBE_VARIABLE}=1)")
    return [warning] if warning else []
