"""Every ``HOROVOD_*`` / ``RINGTRAIN_*`` knob the engine and the Horovod API read, in one frozen object.

``hvd.init()`` calls :meth:`Settings.from_environ` once, before any network is touched, and hands
the result down: the engine, the stall inspector, the store and the API's optimizer and process
sets take their values from it and never read the environment for a knob themselves. A value that
cannot work raises :class:`~ringtrain.exceptions.SettingError` naming the variable, the value, the
unit and what is allowed.

Each field of :class:`Settings` carries a :class:`Knob` (variable, unit, meaning, how to read it);
``docs/settings.md`` holds the table :func:`markdown_table` prints, and a test keeps the two equal.
The launcher's own flags (``ringtrain run --...`` and their ``RINGTRAIN_<FLAG>`` variables) belong to
the command line, not here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ringtrain.exceptions import SettingError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class Refuser(Protocol):
    """What a kind's ``parse`` needs of its caller: the error for a value it refuses (a :class:`Knob`, or
    the command line's flag that sets one)."""

    def refuse(self, text: str, problem: str) -> SettingError: ...


@dataclass(frozen=True)
class Number:
    """A number in ``unit``, at least ``minimum`` (or above it, when ``above`` is set)."""

    unit: str
    minimum: float = 0.0
    above: bool = False
    whole: bool = False
    #: What a special value means (e.g. "0 disables the cache"), for the table and the error.
    note: str = ""

    def expected(self) -> str:
        bound = f"> {self.minimum:g}" if self.above else f">= {self.minimum:g}"
        return f"a {'whole ' if self.whole else ''}number of {self.unit} {bound}"

    def requirement(self) -> str:
        bound = f"> {self.minimum:g}" if self.above else f">= {self.minimum:g}"
        kind = "a whole number of" if self.whole else "in"
        return f"it is {kind} {self.unit} and must be {bound}" + (f"; {self.note}" if self.note else "")

    def parse(self, knob: Refuser, text: str) -> float | int:
        try:
            value = float(text.strip())
        except ValueError:
            raise knob.refuse(text, "is not a number") from None
        if not math.isfinite(value):
            raise knob.refuse(text, "is not a finite number")
        if self.whole and not value.is_integer():
            raise knob.refuse(text, "is not a whole number")
        if value < self.minimum or (self.above and value == self.minimum):
            raise knob.refuse(text, "is out of range")
        return int(value) if self.whole else value


@dataclass(frozen=True)
class Choice:
    """One of a few words (case-insensitive); the first is the default."""

    options: tuple[str, ...]
    meanings: tuple[str, ...]
    unit: str = ""

    def expected(self) -> str:
        return "one of " + ", ".join(repr(o) for o in self.options)

    def requirement(self) -> str:
        words = [f"{o!r} ({m})" for o, m in zip(self.options, self.meanings)]
        return "it must be " + ", ".join(words[:-1]) + " or " + words[-1]

    def parse(self, knob: Refuser, text: str) -> str:
        value = text.strip().lower() or self.options[0]
        if value not in self.options:
            raise knob.refuse(text, "is not a known choice")
        return value


@dataclass(frozen=True)
class Switch:
    """On or off: ``1/true/yes/on`` or ``0/false/no/off`` (any other integer but 0 is on, as in Horovod)."""

    unit: str = ""

    def expected(self) -> str:
        return "1 (on) or 0 (off)"

    def requirement(self) -> str:
        return "it must be 1, true, yes or on (on), or 0, false, no or off (off)"

    def parse(self, knob: Refuser, text: str) -> bool:
        value = text.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        try:
            return int(value) != 0
        except ValueError:
            raise knob.refuse(text, "is not a switch") from None


@dataclass(frozen=True)
class TimelineFile:
    """A file rank 0 writes, or ``DYNAMIC`` (timeline only through ``hvd.start_timeline``)."""

    unit: str = "path"

    def expected(self) -> str:
        return "a file such as timeline.json, or DYNAMIC"

    def requirement(self) -> str:
        return "it is the path of the file rank 0 writes, or DYNAMIC (hvd.start_timeline() only)"

    def parse(self, knob: Refuser, text: str) -> str:
        if text and text != "DYNAMIC" and (text.endswith(("/", os.sep)) or os.path.isdir(text)):
            raise knob.refuse(text, "names a folder, not a file")
        return text


@dataclass(frozen=True)
class Interfaces:
    """Comma-separated names of this host's network interfaces."""

    unit: str = "interface names"

    def expected(self) -> str:
        return "names from that list, comma-separated"

    def requirement(self) -> str:
        return "it is a comma-separated list of interface names of this host"

    def parse(self, knob: Refuser, text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        try:
            present = {name for _, name in socket.if_nameindex()}
        except OSError:  # no interface table to check against: gloo will judge
            return names
        missing = [name for name in names if name not in present]
        if missing:
            raise knob.refuse(text, f"names interfaces this host does not have ({', '.join(missing)}; it "
                                    f"has {', '.join(sorted(present))})")
        return names


Kind = Number | Choice | Switch | TimelineFile | Interfaces


@dataclass(frozen=True)
class Knob:
    """One environment variable: what it means, its unit and how it is read."""

    variable: str
    kind: Kind
    meaning: str
    #: The default as the table and the errors show it.
    shown_default: str

    @property
    def unit(self) -> str:
        return self.kind.unit

    def refuse(self, text: str, problem: str) -> SettingError:
        """The error for a bad value: the variable, the value, what is wrong, what is allowed, the fix."""
        return SettingError(
            f"{self.variable}={text!r} {problem}: {self.kind.requirement()}. HINT: unset {self.variable} "
            f"for the default ({self.shown_default}) or set it to {self.kind.expected()}."
        )

    def read(self, environ: Mapping[str, str], default: Any) -> Any:
        """The value from ``environ``; ``default`` when unset (an empty value counts as unset, except
        for ``HOROVOD_TIMELINE``, where being set at all allows ``start_timeline``)."""
        text = environ.get(self.variable)
        if text is None or (text == "" and not isinstance(self.kind, TimelineFile)):
            return default
        return self.kind.parse(self, text)


def _knob(variable: str, default: Any, kind: Kind, meaning: str, shown: str | None = None) -> Any:
    shown_default = shown if shown is not None else (str(default) if default is not None else "unset")
    return field(default=default, metadata={"knob": Knob(variable, kind, meaning, shown_default)})


_MIB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    """The knobs of one ``init()``: read once, then passed to whoever needs them."""

    fusion_threshold_bytes: int = _knob(
        "HOROVOD_FUSION_THRESHOLD", 128 * _MIB, Number("bytes", whole=True, note="0: no fusion"),
        "largest fused allreduce buffer", shown="134217728 = 128 MiB")
    cycle_time_ms: float = _knob(
        "HOROVOD_CYCLE_TIME", 1.0, Number("milliseconds"),
        "first back-off step between rounds while nothing moves", shown="1")
    cache_capacity: int = _knob(
        "HOROVOD_CACHE_CAPACITY", 1024, Number("entries", whole=True, note="0 disables the cache"),
        "response-cache slots: names seen before cost one entry of the round vector")
    stall_check_disable: bool = _knob(
        "HOROVOD_STALL_CHECK_DISABLE", False, Switch(), "turns the stall inspector off", shown="off")
    stall_check_time_s: float = _knob(
        "HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0, Number("seconds", above=True),
        "rank 0 warns about names some ranks have waited on this long, naming the missing ranks",
        shown="60")
    stall_shutdown_time_s: float = _knob(
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0,
        Number("seconds", note="0: never; only a value above the check time takes effect"),
        "the engine shuts down on every rank once a name has waited this long", shown="0 = never")
    timeline: str | None = _knob(
        "HOROVOD_TIMELINE", None, TimelineFile(),
        "Chrome-trace timeline written by rank 0; DYNAMIC: only between start_timeline and stop_timeline")
    timeline_mark_cycles: bool = _knob(
        "HOROVOD_TIMELINE_MARK_CYCLES", False, Switch(), "marks every round in the timeline", shown="off")
    gloo_timeout_s: float = _knob(
        "HOROVOD_GLOO_TIMEOUT_SECONDS", 300.0, Number("seconds", above=True),
        "how long rendezvous, group setup, control-plane setup and each gloo operation wait for ranks that "
        "are alive (a failed one ends the wait after RINGTRAIN_PEER_TIMEOUT_SECONDS)", shown="300")
    round_timeout_s: float = _knob(
        "RINGTRAIN_ROUND_TIMEOUT_SECONDS", 7 * 24 * 3600.0, Number("seconds", above=True),
        "how long a round waits for a peer that is alive (its heartbeats arrive) but sends no round, "
        "e.g. busy in a long collective of another process set; a dead, hung or unreachable peer ends the "
        "wait after RINGTRAIN_PEER_TIMEOUT_SECONDS",
        shown="604800 = 7 days")
    peer_timeout_s: float = _knob(
        "RINGTRAIN_PEER_TIMEOUT_SECONDS", 20.0, Number("seconds", minimum=1.0),
        "a rank whose heartbeats stop this long (killed, hung, host down, link cut) fails every rank with "
        "HorovodInternalError; ranks that compute or wait still beat. Also the launcher's bound for an "
        "unreachable host", shown="20")
    handshake_timeout_s: float = _knob(
        "RINGTRAIN_HANDSHAKE_TIMEOUT_SECONDS", 10.0, Number("seconds", above=True),
        "how long a connection to the job store or the control plane may take to prove the job's secret "
        "before it is closed (docs/security.md)", shown="10")
    control_plane: str = _knob(
        "RINGTRAIN_CONTROL_PLANE", "tcp",
        Choice(("tcp", "gloo"), ("direct sockets, the default", "a gloo group")),
        "what carries the rounds and small CPU allreduces; rank 0's value decides for the job")
    cpu_allreduce: str = _knob(
        "RINGTRAIN_CPU_ALLREDUCE", "auto",
        Choice(("auto", "ring", "gloo"),
               ("shared memory when every rank is on one host, else the ring; the default",
                "over the control plane's sockets", "gloo")),
        "how CPU allreduces too large for the mesh run; rank 0's value decides for the job")
    eager_elements: int = _knob(
        "RINGTRAIN_EAGER_ELEMENTS", 2048, Number("elements", whole=True, note="0 turns it off"),
        "room in the round vector for small cached Sum/Average allreduces (at most 512 elements each)")
    bucket_cap_mb: float = _knob(
        "RINGTRAIN_BUCKET_CAP_MB", 25.0, Number("MiB", note="0: one request per parameter, as in Horovod"),
        "DistributedOptimizer's gradient bucket size (the first bucket is at most 1 MiB)", shown="25")
    overlap: str = _knob(
        "RINGTRAIN_OVERLAP", "auto",
        Choice(("auto", "on", "off"),
               ("overlap unless every rank is on this host and their threads take every core",
                "always start a bucket's allreduce during the backward pass",
                "send every bucket after the backward pass")),
        "when DistributedOptimizer starts its gradient allreduces (ringtrain/overlap.py)")
    malloc: str = _knob(
        "RINGTRAIN_MALLOC", "tuned",
        Choice(("tuned", "system"),
               ("glibc keeps freed memory below 32 MiB for the next step instead of returning it to the "
                "kernel, so steps do not fault fresh pages in; the default",
                "glibc's own defaults")),
        "how malloc serves a training process (ringtrain/env/allocator.py); read at hvd.init() and by the "
        "Trainer; a user's MALLOC_*_ variables, glibc.malloc tunables or an LD_PRELOADed allocator win")
    bind: str = _knob(
        "RINGTRAIN_BIND", "none",
        Choice(("none", "core"),
               ("the kernel places every thread; the default",
                "rank r of n on a host runs on the r-th of n equal shares of its physical cores, like "
                "mpirun --bind-to core; left alone where the process is bound already")),
        "where a rank's threads run (ringtrain/env/binding.py); read at hvd.init() and by the Trainer")
    hierarchical_allreduce: bool = _knob(
        "HOROVOD_HIERARCHICAL_ALLREDUCE", False, Switch(),
        "allreduce within each host first, then across hosts (one rank per host), then broadcast within "
        "the host; rank 0's value decides for the job", shown="off")
    hierarchical_allgather: bool = _knob(
        "HOROVOD_HIERARCHICAL_ALLGATHER", False, Switch(),
        "allgather within each host first, then across hosts, then broadcast within the host; rank 0's "
        "value decides for the job", shown="off")
    dynamic_process_sets: bool = _knob(
        "HOROVOD_DYNAMIC_PROCESS_SETS", False, Switch(),
        "allows add_process_set / remove_process_set after init", shown="off")
    elastic: bool = _knob(
        "HOROVOD_ELASTIC", False, Switch(),
        "set by elastic launchers: DistributedOptimizer communicates even in a one-rank job", shown="off")
    gloo_socket_ifname: tuple[str, ...] = _knob(
        "GLOO_SOCKET_IFNAME", (), Interfaces(),
        "interfaces for gloo's connections and the first control-plane addresses to offer", shown="unset")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read every knob from ``environ`` (default ``os.environ``); the first bad value raises."""
        environ = os.environ if environ is None else environ
        values = {f.name: knob_of(f).read(environ, f.default) for f in dataclasses.fields(cls)}
        return cls(**values)


def read_knob(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One field of :class:`Settings` (by field name) read from ``environ``, checked like the rest.

    For processes that need one knob and must not judge the others, such as a launcher's agent on a
    host whose interfaces differ from the workers' (``GLOO_SOCKET_IFNAME``).
    """
    environ = os.environ if environ is None else environ
    settings_field = next(f for f in dataclasses.fields(Settings) if f.name == name)
    return knob_of(settings_field).read(environ, settings_field.default)


def check_environ(environ: Mapping[str, str], skip: tuple[str, ...] = ()) -> None:
    """Raise the first :class:`SettingError` among the knobs set in ``environ`` (variables in ``skip``
    are not judged): the launcher checks its workers' variables with the rules the workers use."""
    for knob in knobs():
        if knob.variable not in skip:
            knob.read(environ, None)


def knob_of(settings_field: dataclasses.Field) -> Knob:
    """The knob behind one field of :class:`Settings`."""
    return settings_field.metadata["knob"]


def knobs() -> list[Knob]:
    """Every knob, in the order of the fields."""
    return [knob_of(f) for f in dataclasses.fields(Settings)]


def markdown_table() -> str:
    """The table of ``docs/settings.md``: variable, unit, default, meaning and allowed values."""
    lines = ["| Variable | Unit | Default | Meaning | Allowed |", "|---|---|---|---|---|"]
    for knob in knobs():
        allowed = knob.kind.requirement().removeprefix("it ")
        lines.append(f"| `{knob.variable}` | {knob.unit or '-'} | {knob.shown_default} | {knob.meaning} "
                     f"| {allowed} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
