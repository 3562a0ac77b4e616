"""The driver's side of the watch: one decision over the ranks of every host of a multi-host job.

Each host's agent sends its ranks' views once a second as a marker line on its stderr
(:meth:`ringtrain.watch.node.NodeWatch.send_views`); :class:`JobWatch` keeps the newest of every host
and decides as a node's watch does, over all of them. Stacks are asked of every agent through the link
(``stacks ID`` on its stdin); each takes its ranks' stacks on its own host, writes them to a file there,
and answers with the file's path and each rank's main thread. At the hang timeout the driver stops the
job and reports the watch's verdict as its root cause.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from typing import Any

from ringtrain.watch.diagnosis import RankView
from ringtrain.watch.node import STACKS_MARKER, WATCH_MARKER, NodeWatch, WatchSettings

#: How long the driver waits for every agent's stacks.
STACKS_WAIT_S = 5.0


def view_from_wire(body: dict[str, Any], received: float) -> RankView:
    """A rank's view as an agent sent it, timed on this machine's clock (``quiet``: seconds since its
    last progress as the agent measured it)."""
    fields = {k: v for k, v in body.items() if k in RankView.__dataclass_fields__}
    where = fields.get("where")
    fields["where"] = (str(where[0]), int(where[1] or 0), str(where[2])) if where else None
    pending = fields.get("engine_pending")
    fields["engine_pending"] = tuple(pending) if pending is not None else None
    fields["progress_time"] = received - float(body.get("quiet", 0.0))
    return RankView(**fields)


class JobWatch(NodeWatch):
    """The watch of a multi-host job, fed by its agents' marker lines (:meth:`take`)."""

    def __init__(self, world_size: int, say: Callable[[str], None], settings: WatchSettings,
                 ask_for_stacks: Callable[[bytes], int], *, clock: Callable[[], float] = time.time,
                 stacks_wait: float = STACKS_WAIT_S, stacks_dir: str | None = None) -> None:
        super().__init__(".", "", lambda: (), say, settings, end=lambda pids: None, clock=clock,
                         stacks_wait=stacks_wait, stacks_dir=stacks_dir)
        self.world_size = world_size
        self._ask = ask_for_stacks
        self._lock = threading.Lock()
        self._hosts: dict[str, list[RankView]] = {}
        self._answers: dict[str, dict[str, Any]] = {}
        self._answered = threading.Condition(self._lock)
        self._progress: dict[tuple[int, int], tuple[Any, float]] = {}
        """(rank, pid) -> (its progress time as its agent sent it, the same moment on this clock)."""

    def take(self, line: str) -> bool:
        """An agent's line: True when it was the watch's (and must not reach the console)."""
        for marker, handle in ((WATCH_MARKER, self._take_views), (STACKS_MARKER, self._take_stacks)):
            if line.startswith(marker):
                try:
                    handle(json.loads(line[len(marker):]))
                except (ValueError, TypeError, KeyError):
                    pass  # a line of a newer or broken agent: the watch goes without it
                return True
        return False

    def _take_views(self, body: dict[str, Any]) -> None:
        received = self.clock()
        views = []
        for wire in body["views"]:
            view = view_from_wire(wire, received)
            # the same progress as the agent's last line: the same moment here too (a new line's
            # delay must not read as progress, nor move the spell the report was given for)
            key, before = (view.rank, view.pid), self._progress.get((view.rank, view.pid))
            if before is not None and before[0] == wire.get("progress_time"):
                view = replace(view, progress_time=before[1])
            self._progress[key] = (wire.get("progress_time"), view.progress_time)
            views.append(view)
        ranks = set(range(self.world_size))
        with self._lock:
            self._hosts[str(body["host"])] = views
            for rank, pairs in (body.get("arrivals") or {}).items():
                keys: list[tuple[Hashable, float]] = [
                    (k if isinstance(k, str) else int(k), float(t)) for k, t in pairs]
                self.arrivals.add(int(rank), keys, ranks)

    def _take_stacks(self, body: dict[str, Any]) -> None:
        with self._answered:
            self._answers[str(body["id"])] = self._answers.get(str(body["id"]), {})
            self._answers[str(body["id"])][str(body["host"])] = body
            self._answered.notify_all()

    def views(self) -> list[RankView]:
        with self._lock:
            views = [view for host_views in self._hosts.values() for view in host_views]
        # decided only once every rank is seen: a host not heard yet may hold the rank waited for
        return views if len({v.rank for v in views}) == self.world_size else []

    def host_of(self, rank: int) -> str:
        with self._lock:
            return next((v.host for views in self._hosts.values() for v in views if v.rank == rank), "?")

    def collect_stacks(self, views: Sequence[RankView]) -> str | None:
        """Ask every agent for its ranks' stacks; one file here says where each host wrote them and
        holds each rank's main thread."""
        self._requests += 1
        request = f"{os.getpid()}-{self._requests}"
        asked = self._ask(f"{request}".encode())
        hosts = {v.host for v in views}
        deadline = time.monotonic() + self.stacks_wait
        with self._answered:
            while len(self._answers.get(request, {})) < min(asked, len(hosts)):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    break
                self._answered.wait(min(left, 0.5))
            answers = self._answers.pop(request, {})
        self._stacks = {int(rank): text for body in answers.values() for rank, text in body["main"].items()}
        parts = []
        for host in sorted(hosts):
            body = answers.get(host)
            where = body.get("file") if body else None
            parts.append(f"=== host {host}: every thread of its ranks in {where}" if where else
                         f"=== host {host}: no stacks (no answer from its agent in {self.stacks_wait:g} s)")
            for view in sorted((v for v in views if v.host == host), key=lambda v: v.rank):
                text = self._stacks.get(view.rank, "(no stack)\n")
                parts.append(f"--- rank {view.rank} (pid {view.pid}), {view.condition()}, main thread:\n"
                             f"{text}")
        return self.write_stacks(parts)
