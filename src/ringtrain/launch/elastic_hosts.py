"""The hosts of an elastic job: discovery, failures and the blacklist, and each generation's slots.

Discovery (``--host-discovery-script``, or a fixed ``-H`` / ``--hostfile`` list) says which hosts
exist and how many slots each has. A :class:`HostRegistry` remembers the order in which hosts were
first seen (older hosts get lower ranks), counts each host's failures and keeps the blacklist: a host
whose workers failed in ``failures_to_blacklist`` generations (default 2; Horovod blacklists at the
first) is left out, for good or, with ``--blacklist-cooldown-range MIN MAX``, for a cooldown that
starts at MIN seconds, doubles with each new blacklisting (plus a random fraction of MIN) and never
exceeds MAX. A host that could not even start a worker (ssh refused, the job store unreachable
from it) is blacklisted at once. After its cooldown a host comes back with one failure to spare.

:func:`plan_generation` places the workers of the next generation: hosts in order, each up to its
slots, at most ``--max-np`` in all; survivors keep their (host, local rank); hosts holding a
survivor come first, and on each host survivors come before new workers, so rank 0 always holds
state to broadcast when there is a survivor at all.
"""

from __future__ import annotations

import math
import random
import re
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ringtrain.engine.elastic_rendezvous import Slot
from ringtrain.exceptions import UsageError

#: horovodrun's bounds for --blacklist-cooldown-range (seconds).
COOLDOWN_LOWER_BOUND = 1
COOLDOWN_UPPER_BOUND = 3600
#: Failed generations after which a host is blacklisted (RINGTRAIN_ELASTIC_FAILURES_TO_BLACKLIST).
DEFAULT_FAILURES_TO_BLACKLIST = 2

_HOST = re.compile(r"^[\w.-]+$")


class DiscoveryError(RuntimeError):
    """The discovery script failed or printed something that is not ``host[:slots]`` lines."""


def parse_discovery_output(text: str, default_slots: int | None, source: str) -> dict[str, int]:
    """``{host: slots}`` from ``host[:slots]`` lines (blank lines and ``#`` comments are skipped)."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, sep, count = line.rpartition(":")
        if not sep:
            host, count = line, ""
        if not _HOST.match(host):
            raise DiscoveryError(f"{source} line {number}: {raw.strip()!r} is not 'host' or 'host:slots'. "
                                 "HINT: print one host per line, e.g. 'node1:4'.")
        if count:
            if not count.isdigit() or int(count) < 1:
                raise DiscoveryError(f"{source} line {number}: {raw.strip()!r} has no valid slot count. "
                                     "HINT: write host:N with N >= 1, e.g. 'node1:4'.")
            slots = int(count)
        elif default_slots is not None:
            slots = default_slots
        else:
            raise DiscoveryError(f"{source} line {number}: {raw.strip()!r} gives no slot count and "
                                 "--slots-per-host was not given. HINT: print 'host:slots', or pass "
                                 "--slots-per-host N.")
        if hosts.get(host, slots) != slots:
            raise DiscoveryError(f"{source} lists host {host!r} twice with different slots ({hosts[host]} "
                                 f"and {slots}). HINT: list each host once.")
        hosts[host] = slots
    return hosts


class ScriptDiscovery:
    """Runs ``--host-discovery-script`` (through ``sh -c``, like horovodrun) and parses what it prints."""

    def __init__(self, script: str, default_slots: int | None, timeout: float = 30.0) -> None:
        self.script = script
        self.default_slots = default_slots
        self.timeout = timeout

    def describe(self) -> str:
        return f"--host-discovery-script {self.script}"

    def find(self) -> dict[str, int]:
        try:
            result = subprocess.run(["/bin/sh", "-c", self.script], stdin=subprocess.DEVNULL,
                                    capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"--host-discovery-script {self.script!r} did not finish within "
                                 f"{self.timeout:g} s. HINT: make it print the hosts and exit quickly."
                                 ) from None
        if result.returncode != 0:
            detail = (result.stderr.strip().splitlines() or [""])[-1]
            raise DiscoveryError(f"--host-discovery-script {self.script!r} exited with code "
                                 f"{result.returncode}{': ' + detail if detail else ''}. HINT: check that it "
                                 "is executable (chmod +x) and prints 'host:slots' lines.")
        return parse_discovery_output(result.stdout, self.default_slots, "--host-discovery-script output")


class FixedHosts:
    """A fixed host list (``-H`` / ``--hostfile`` / this machine): the same answer every time."""

    def __init__(self, hosts: Mapping[str, int], source: str) -> None:
        self.hosts = dict(hosts)
        self.source = source

    def describe(self) -> str:
        return self.source

    def find(self) -> dict[str, int]:
        return dict(self.hosts)


@dataclass
class HostState:
    """What the registry knows about one host."""

    failures: int = 0
    blacklisted: bool = False
    blacklistings: int = 0
    cooldown_until: float | None = None
    """When a blacklisted host may come back (clock seconds); None with ``blacklisted``: never."""
    reason: str = ""


@dataclass
class HostRegistry:
    """Discovered hosts, their order, failures and the blacklist (thread-safe)."""

    cooldown_range: tuple[int, int] | None = None
    failures_to_blacklist: int = DEFAULT_FAILURES_TO_BLACKLIST
    clock: Callable[[], float] = time.monotonic
    rng: Callable[[], float] = random.random
    found: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    states: dict[str, HostState] = field(default_factory=dict)
    version: int = 0
    """Bumped whenever the usable hosts may have changed (discovery, blacklist, cooldown)."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()

    def update(self, found: Mapping[str, int]) -> bool:
        """Take a discovery result; True when it differs from the previous one."""
        with self._lock:
            if dict(found) == self.found:
                return False
            self.found = dict(found)
            for host in found:
                if host not in self.order:
                    self.order.append(host)
            self.version += 1
            return True

    def state(self, host: str) -> HostState:
        with self._lock:
            return self.states.setdefault(host, HostState())

    def record_failure(self, host: str, reason: str) -> bool:
        """A generation in which workers of ``host`` failed; True when that blacklists it."""
        with self._lock:
            state = self.state(host)
            state.failures += 1
            if state.failures >= self.failures_to_blacklist and not state.blacklisted:
                self._blacklist(host, f"{reason} ({state.failures} failures)")
                return True
            return False

    def record_unreachable(self, host: str, reason: str) -> None:
        """``host`` could not start a worker at all: blacklisted at once."""
        with self._lock:
            state = self.state(host)
            state.failures = max(state.failures + 1, self.failures_to_blacklist)
            if not state.blacklisted:
                self._blacklist(host, reason)

    def _blacklist(self, host: str, reason: str) -> None:
        state = self.state(host)
        state.blacklisted = True
        state.blacklistings += 1
        state.reason = reason
        if self.cooldown_range is None:
            state.cooldown_until = None
        else:
            lower, upper = self.cooldown_range
            delay = lower * 2 ** (state.blacklistings - 1) + self.rng() * lower
            state.cooldown_until = self.clock() + max(lower, min(upper, delay))
        self.version += 1

    def refresh(self) -> list[str]:
        """Let hosts whose cooldown ended back in (one more failure blacklists them again); their names."""
        now = self.clock()
        back = []
        with self._lock:
            for host, state in self.states.items():
                if state.blacklisted and state.cooldown_until is not None and now >= state.cooldown_until:
                    state.blacklisted = False
                    state.cooldown_until = None
                    state.failures = self.failures_to_blacklist - 1
                    back.append(host)
            if back:
                self.version += 1
        return back

    def is_blacklisted(self, host: str) -> bool:
        with self._lock:
            return host in self.states and self.states[host].blacklisted

    def available(self) -> list[tuple[str, int]]:
        """Usable hosts with their slots, oldest first."""
        with self._lock:
            return [(h, self.found[h]) for h in self.order if h in self.found and not self.is_blacklisted(h)]

    def describe(self) -> str:
        """The discovered hosts and the blacklist, for error messages."""
        with self._lock:
            usable = ",".join(f"{h}:{s}" for h, s in self.available()) or "none"
            parts = [f"usable hosts: {usable}"]
            now = self.clock()
            for host in self.order:
                state = self.states.get(host)
                if state is None or not state.blacklisted:
                    continue
                until = ("for good (no --blacklist-cooldown-range)" if state.cooldown_until is None
                         else f"for another {max(0.0, state.cooldown_until - now):.0f} s")
                parts.append(f"blacklisted: {host} {until}: {state.reason}")
            return "; ".join(parts)


@dataclass(frozen=True)
class Survivor:
    """A worker that outlived its generation and waits for the next one."""

    worker: str
    host: str
    local_rank: int
    rank: int
    """Its rank in the generation it left (the oldest keeps rank 0)."""


def plan_generation(hosts: Sequence[tuple[str, int]], survivors: Sequence[Survivor],
                    max_np: int | None) -> list[tuple[str | None, Slot]]:
    """The next generation's workers: ``(survivor id or None for a new worker, its slot)``, in rank order."""
    first_rank: dict[str, int] = {}
    for s in survivors:
        first_rank[s.host] = min(first_rank.get(s.host, s.rank), s.rank)
    slots_of = dict(hosts)
    ordered = sorted((h for h in slots_of if h in first_rank), key=lambda h: first_rank[h])
    ordered += [h for h, _ in hosts if h not in first_rank]
    budget = math.inf if max_np is None else max_np
    used: list[tuple[str, int]] = []
    for host in ordered:
        take = int(min(slots_of[host], budget))
        if take <= 0:
            break
        used.append((host, take))
        budget -= take
    placements: list[tuple[str | None, str, int, int]] = []  # (worker, host, local rank, local size)
    for host, take in used:
        kept = sorted((s for s in survivors if s.host == host and s.local_rank < take), key=lambda s: s.rank)
        taken = {s.local_rank for s in kept}
        placements += [(s.worker, host, s.local_rank, take) for s in kept]
        placements += [(None, host, lr, take) for lr in range(take) if lr not in taken]
    size = len(placements)
    out = []
    for rank, (worker, host, local_rank, local_size) in enumerate(placements):
        holders = [h for h, take in used if take > local_rank]
        out.append((worker, Slot(hostname=host, rank=rank, size=size, local_rank=local_rank,
                                 local_size=local_size, cross_rank=holders.index(host),
                                 cross_size=len(holders))))
    return out


def check_cooldown_range(value: Sequence[int]) -> tuple[int, int]:
    """``--blacklist-cooldown-range MIN MAX`` within horovodrun's bounds, MIN <= MAX."""
    lower, upper = int(value[0]), int(value[1])
    if lower < COOLDOWN_LOWER_BOUND or upper > COOLDOWN_UPPER_BOUND or lower > upper:
        raise UsageError(f"--blacklist-cooldown-range {lower} {upper} is not a range of seconds within "
                         f"[{COOLDOWN_LOWER_BOUND}, {COOLDOWN_UPPER_BOUND}] with MIN <= MAX. HINT: write "
                         "e.g. --blacklist-cooldown-range 10 300.")
    return lower, upper


__all__ = ["COOLDOWN_LOWER_BOUND", "COOLDOWN_UPPER_BOUND", "DEFAULT_FAILURES_TO_BLACKLIST", "DiscoveryError",
           "FixedHosts", "HostRegistry", "HostState", "ScriptDiscovery", "Survivor", "check_cooldown_range",
           "parse_discovery_output", "plan_generation"]
