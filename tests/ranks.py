"""Real ranks for tests: processes on gloo over loopback, kept alive across tests.

``RankPool(n)`` starts ``n`` spawned processes with the torchrun variables set (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and the job's secret, one thread each.
``pool.run(fn, *args)``
calls the module-level function ``fn(*args)`` on every rank at once and returns the results in rank
order; if any rank raises, :class:`RankFailure` carries every rank's traceback. Each call gets a
fresh MASTER_PORT, as a new job would. A rank that does not
answer within ``timeout`` seconds breaks the pool: it is killed and the next ``run`` starts it afresh,
so one hanging test cannot hang the suite.

Functions run in the ranks must be importable (defined at module level in a test module).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any


class RankFailure(AssertionError):
    """One or more ranks raised or did not answer."""


#: The secret of every test job (an empty RINGTRAIN_JOB_SECRET in ``env`` runs one unauthenticated).
TEST_SECRET = "tests" * 13


def free_port() -> int:
    """A TCP port that is free on loopback right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a launcher would give rank ``rank``, all on this host."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        # The ranks of one test job share a secret, as ranks started by `ringtrain run` do.
        "RINGTRAIN_JOB_SECRET": TEST_SECRET,
    }
    env.update(extra or {})
    return env


def _worker(rank: int, env: dict[str, str], conn: Any) -> None:
    os.environ.update(env)
    import torch

    torch.set_num_threads(1)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            # Leave at once: the interpreter's own teardown of torch takes seconds on a loaded machine
            # and checks nothing a test asked for (close() used to wait 2 s per rank, then kill it).
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        fn, args, kwargs, port = message
        # A fresh rendezvous port per call: a store left bound by an earlier test (ringtrain's engine
        # keeps its base store alive across re-inits) must not collide with this test's rendezvous.
        os.environ["MASTER_PORT"] = str(port)
        try:
            result = fn(*args, **kwargs)
            conn.send(("ok", result))
        except BaseException as exc:  # every failure goes back to the test
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class RankPool:
    """``world_size`` live ranks that run test functions together."""

    def __init__(self, world_size: int, env: Mapping[str, str] | None = None) -> None:
        self.world_size = world_size
        self.extra_env = dict(env or {})
        self._procs: list[Any] = []
        self._conns: list[Any] = []

    def pids(self) -> list[int]:
        """The process ids of the live ranks (none before the first ``run``)."""
        return [proc.pid for proc in self._procs if proc.pid is not None]

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self._procs, self._conns = [], []
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            env = rank_env(rank, self.world_size, port, self.extra_env)
            proc = ctx.Process(target=_worker, args=(rank, env, child), daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 120.0, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; results in rank order."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self.start()
        port = free_port()
        for conn in self._conns:
            conn.send((fn, args, kwargs, port))
        deadline = time.monotonic() + timeout
        replies: list[Any] = [None] * self.world_size
        pending = set(range(self.world_size))
        while pending and time.monotonic() < deadline:
            for rank in list(pending):
                conn = self._conns[rank]
                try:
                    if conn.poll(0.05):
                        replies[rank] = conn.recv()
                        pending.discard(rank)
                except (EOFError, OSError):
                    replies[rank] = ("error", f"rank {rank} died (exit code {self._procs[rank].exitcode})")
                    pending.discard(rank)
        if pending:
            self.close()
            others = {r: replies[r] for r in range(self.world_size) if r not in pending}
            raise RankFailure(f"{fn.__name__}: ranks {sorted(pending)} did not answer within {timeout}s; "
                              f"the others answered {others}")
        errors = [(rank, reply[1]) for rank, reply in enumerate(replies) if reply[0] == "error"]
        if errors:
            # A failed collective can leave the survivors in a broken process group: start afresh.
            self.close()
            detail = "\n".join(f"--- rank {rank} ---\n{text}" for rank, text in errors)
            raise RankFailure(f"{fn.__name__} failed on ranks {[r for r, _ in errors]}:\n{detail}")
        return [reply[1] for reply in replies]

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        # One deadline for the whole pool, not one per rank: the ranks leave together.
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs, self._conns = [], []


def run_ranks(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0,
              env: Mapping[str, str] | None = None, **kwargs: Any) -> list[Any]:
    """One-shot: start ``world_size`` ranks, run ``fn`` once, stop them."""
    pool = RankPool(world_size, env)
    try:
        return pool.run(fn, *args, timeout=timeout, **kwargs)
    finally:
        pool.close()
