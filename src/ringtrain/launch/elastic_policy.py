"""What the elastic driver does next, decided from what it saw: a pure policy.

The driver (:mod:`ringtrain.launch.elastic_driver`) observes: the hosts discovery finds and the
registry leaves usable, the workers that exit (their code, a lost heartbeat, a worker that never
reached the job store, a transport that could not start it or lost its host), the members that left
a generation, the resets spent against ``--reset-limit``, a stop signal. It asks an
:class:`ElasticPolicy` what to do and acts on the :class:`Decision`; the policy reads no clock (the
driver passes the seconds waited), starts nothing, writes nothing.

The decisions:

- a worker's end (:meth:`ElasticPolicy.judge_failure`): why it failed, and what that says of its
  host: blacklisted at once (no worker can start there: the next generation forms without it), one
  more failure counted (the registry blacklists at ``failures_to_blacklist``; until then the host's
  slot gets a new worker, the in-place restart) or nothing (counted already in this generation);
- waiting for a generation (:meth:`~ElasticPolicy.formation`): form it (with its plan), wait for
  hosts, or give up (no survivor, the slots missing for ``--elastic-timeout``, no survivor placed);
- a generation every member has left (:meth:`~ElasticPolicy.after_break`): re-form, or give up at
  ``--reset-limit``;
- a generation a member finished (:meth:`~ElasticPolicy.ending`): wait for the others, end 0, or
  give up (a member failed);
- a stop signal (:meth:`~ElasticPolicy.on_stop`): stop, with 128 + the signal's number;
- bounds (:meth:`~ElasticPolicy.overdue_leaving`, :meth:`~ElasticPolicy.overdue_joining`): a member
  that takes too long to leave a broken generation or to join a new one is killed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ringtrain.engine.elastic_rendezvous import Slot
from ringtrain.exceptions import UsageError
from ringtrain.launch.elastic_hosts import DEFAULT_FAILURES_TO_BLACKLIST, Survivor, plan_generation
from ringtrain.launch.elastic_worker import UNREACHABLE_EXIT

if TYPE_CHECKING:
    from ringtrain.launch.config import LaunchConfig

#: horovodrun's default --elastic-timeout (also HOROVOD_ELASTIC_TIMEOUT).
DEFAULT_ELASTIC_TIMEOUT = 600.0


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic part of a ``LaunchConfig``, with every default resolved."""

    num_proc: int
    min_np: int
    max_np: int | None
    timeout: float
    reset_limit: int | None
    cooldown_range: tuple[int, int] | None
    failures_to_blacklist: int

    @classmethod
    def from_config(cls, config: LaunchConfig, environ: Mapping[str, str]) -> ElasticSettings:
        num_proc = config.num_proc or config.min_np or 1
        timeout = config.elastic_timeout
        if timeout is None:
            timeout = _read_number(environ, "HOROVOD_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT, "seconds", 0)
        failures = int(_read_number(environ, "RINGTRAIN_ELASTIC_FAILURES_TO_BLACKLIST",
                                    DEFAULT_FAILURES_TO_BLACKLIST, "failed generations", 1))
        return cls(num_proc=num_proc, min_np=config.min_np or num_proc, max_np=config.max_np,
                   timeout=float(timeout), reset_limit=config.reset_limit,
                   cooldown_range=config.cooldown_range,
                   failures_to_blacklist=failures)


def _read_number(environ: Mapping[str, str], name: str, default: float, unit: str, lowest: float) -> float:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= lowest or value == float("inf"):
        raise UsageError(f"{name}={text!r} is not a number of {unit} >= {lowest:g}. HINT: set it to e.g. "
                         f"{default:g}, or unset it.")
    return value


class Action(Enum):
    """What the driver does next."""

    FORM = "form the next generation"
    WAIT_FOR_HOSTS = "wait for hosts"
    RE_FORM = "re-form the group"
    WAIT_FOR_EXITS = "wait for the members' exits"
    FINISH = "end the job, every member done"
    GIVE_UP = "give up"
    STOP = "stop on a signal"


#: Plan of a generation: ``(survivor id or None for a new worker, its slot)`` in rank order.
Plan = tuple[tuple[str | None, Slot], ...]


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    """GIVE_UP: what follows ``the job stops: `` ('': the root-cause report alone says it)."""
    exit_code: int | None = None
    """FINISH, GIVE_UP, STOP: the launcher's exit code."""
    plan: Plan = ()
    """FORM: the next generation's workers."""
    reset: int = 0
    """RE_FORM: the number of this reset (1 for the first)."""
    after_failure: bool = False
    """RE_FORM: a member failed (else the members left for changed hosts)."""
    stop_waiting: bool = False
    """WAIT_FOR_EXITS: members wait to re-form a generation that is over: tell them to stop."""


class Cause(Enum):
    """Why a worker ended with a non-zero code, as the driver tells it."""

    EXITED = "its exit code or signal"
    LOST_HEARTBEAT = "no word from it for the peer timeout"
    NO_JOB_STORE = "it could not reach the job store from its host"
    NOT_STARTED = "its place could not start it (ssh, the Ray actor)"
    LOST_CONTACT = "its transport lost the host"


class HostAction(Enum):
    """What a worker's failure does to its host."""

    BLACKLIST = "blacklist it now: no worker can start there"
    COUNT_FAILURE = "count a failed generation against it"
    NONE = "nothing: counted already in this generation"


@dataclass(frozen=True)
class WorkerEnd:
    """A worker's non-zero exit, as the driver saw it."""

    code: int
    reached_store: bool
    """The worker process started and reached the job store (its alive key)."""
    lost_heartbeat: bool = False
    """The driver gave it up after the peer timeout without a word (and killed it)."""
    unreachable: bool = False
    """Its place says it could not be started there (ssh exit 255, a Ray actor that did not start)."""
    lost_contact: bool = False
    """Its place says the transport lost the host (ssh keep-alives, a lost Ray actor)."""
    host_failed_already: bool = False
    """Another worker of its host failed in the same generation."""


@dataclass(frozen=True)
class Verdict:
    cause: Cause
    host: HostAction


@dataclass(frozen=True)
class ElasticPolicy:
    """The elastic driver's decisions (see the module doc); ``start_timeout``: ``--start-timeout``."""

    settings: ElasticSettings
    start_timeout: float

    def on_stop(self, signum: int) -> Decision:
        return Decision(Action.STOP, exit_code=128 + signum)

    def judge_failure(self, end: WorkerEnd) -> Verdict:
        no_store = not end.reached_store and end.code == UNREACHABLE_EXIT
        not_started = not end.reached_store and end.unreachable
        if end.lost_heartbeat:
            cause = Cause.LOST_HEARTBEAT
        elif no_store:
            cause = Cause.NO_JOB_STORE
        elif not_started:
            cause = Cause.NOT_STARTED
        elif end.lost_contact:
            cause = Cause.LOST_CONTACT
        else:
            cause = Cause.EXITED
        if no_store or not_started:
            host = HostAction.BLACKLIST
        elif end.host_failed_already:
            host = HostAction.NONE
        else:
            host = HostAction.COUNT_FAILURE
        return Verdict(cause, host)

    def formation(self, *, first: bool, survivors: Sequence[Survivor], available: Sequence[tuple[str, int]],
                  waited: float, hosts: str, source: str) -> Decision:
        """The next generation: the first (``-np`` slots) or one after a break (``--min-np`` slots, and a
        survivor to hand on the state). ``waited``: seconds since the wait began; ``hosts``: the
        registry's description, ``source``: the discovery's (both for the messages)."""
        if not first and not survivors:
            return _give_up("every worker failed, so no state is left to go on from")
        need = self.settings.num_proc if first else self.settings.min_np
        count = sum(slots for _, slots in available)
        if count < need:
            if waited > self.settings.timeout:
                return _give_up(
                    f"only {count} slot(s) usable, fewer than the {need} needed "
                    f"({'-np' if first else '--min-np'} {need}), for --elastic-timeout "
                    f"{self.settings.timeout:g} s ({hosts}; hosts from {source}). HINT: add hosts or slots, "
                    "lower --min-np, or raise --elastic-timeout.")
            return Decision(Action.WAIT_FOR_HOSTS)
        plan = tuple(plan_generation(available, survivors, self.settings.max_np))
        if not first and not any(wid is not None for wid, _ in plan):
            return _give_up("no surviving worker has a slot in the next generation, so nobody holds the "
                            f"committed state to broadcast ({hosts}). HINT: raise --max-np, or keep the "
                            "hosts of the running workers in the discovery output.")
        return Decision(Action.FORM, plan=plan)

    def after_break(self, *, resets: int, failed: int) -> Decision:
        """Every member of a broken generation has left or exited; ``resets`` spent so far, ``failed``
        members that exited non-zero."""
        limit = self.settings.reset_limit
        if limit is not None and resets >= limit:
            return _give_up(f"the group broke again after --reset-limit {limit} re-formation(s). HINT: raise "
                            "--reset-limit, or look at the root cause below.")
        return Decision(Action.RE_FORM, reset=resets + 1, after_failure=failed > 0)

    def ending(self, codes: Mapping[str, int | None], left: Collection[str]) -> Decision:
        """A member exited 0: the job is over once every member has exited (``codes``; None: running)."""
        running = [wid for wid, code in codes.items() if code is None]
        if running:
            return Decision(Action.WAIT_FOR_EXITS, stop_waiting=any(wid in left for wid in running))
        if all(code == 0 for code in codes.values()):
            return Decision(Action.FINISH, exit_code=0)
        return _give_up("")

    def overdue_leaving(self, broken_for: float) -> bool:
        """A member still in a generation that broke ``broken_for`` s ago is killed."""
        return broken_for > self.settings.timeout

    def overdue_joining(self, formed_for: float) -> bool:
        """A member not in ``hvd.init()`` of a generation formed ``formed_for`` s ago is killed."""
        return formed_for > self.settings.timeout + self.start_timeout


def _give_up(reason: str) -> Decision:
    return Decision(Action.GIVE_UP, reason=reason, exit_code=1)


__all__ = ["DEFAULT_ELASTIC_TIMEOUT", "Action", "Cause", "Decision", "ElasticPolicy", "ElasticSettings",
           "HostAction", "Plan", "Verdict", "WorkerEnd"]
