"""Heartbeats and bounded waits: a silent peer is declared failed, a busy one is not, waits end."""

from __future__ import annotations

import datetime
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ringtrain.engine import liveness
from ringtrain.exceptions import ControlPlaneError
from tests.ranks import free_port, rank_env

REPO = Path(__file__).resolve().parents[2]


class _Reports:
    """What the heartbeats of each rank reported, with an event per rank."""

    def __init__(self, size: int) -> None:
        self.reasons: dict[int, str] = {}
        self.events = {r: threading.Event() for r in range(size)}

    def callback(self, rank: int):
        def report(reason: str) -> None:
            self.reasons[rank] = reason
            self.events[rank].set()
        return report


def _start(size: int, timeout_s: float, reports: _Reports, address=lambda r: "127.0.0.1",
           secret: str | None = None, store=None):
    store = dist.HashStore() if store is None else store
    out: dict[int, object] = {}

    def start(rank: int) -> None:
        out[rank] = liveness.Heartbeats.start(
            store, rank, size, f"host{rank}", "node", ["127.0.0.1"], address, timeout_s, 30.0,
            reports.callback(rank), secret=secret, scope="test/gen1")

    threads = [threading.Thread(target=start, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(isinstance(out.get(r), liveness.Heartbeats) for r in range(size)), out
    return [out[r] for r in range(size)]


def _silence(beats: liveness.Heartbeats) -> None:
    """Stop a rank's heartbeats without a goodbye: what a hung or vanished rank looks like."""
    beats._stop.set()
    beats._thread.join(10)


def test_a_silent_peer_is_declared_failed_by_every_other_rank_naming_it():
    reports = _Reports(3)
    beats = _start(3, 1.0, reports)
    try:
        _silence(beats[2])
        for rank in (0, 1):
            assert reports.events[rank].wait(30), reports.reasons
            assert "rank 2 on host host2" in reports.reasons[rank]
            assert "RINGTRAIN_PEER_TIMEOUT_SECONDS" in reports.reasons[rank]
        assert 2 not in reports.reasons
    finally:
        for b in beats:
            b.stop()


@pytest.mark.slow  # peers beat through seconds of busy work (5.5 s): outside the contributor's 4-minute lane
def test_a_goodbye_is_not_a_failure_and_busy_peers_keep_beating():
    reports = _Reports(2)
    beats = _start(2, 1.0, reports)
    try:
        # Rank 0 "computes": its heartbeats come from their own thread, so nothing is reported.
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            sum(i * i for i in range(20000))
        assert not reports.reasons
        beats[1].stop()  # a normal shutdown says goodbye
        time.sleep(2.5)  # well past the timeout: the goodbye must have been taken
        assert not reports.reasons
    finally:
        for b in beats:
            b.stop()


def test_peers_never_heard_from_are_not_judged(caplog):
    # Rank 1's heartbeats go to an address where nobody is (TEST-NET-1): as if UDP were filtered.
    reports = _Reports(2)
    with caplog.at_level("WARNING", logger="ringtrain.engine"):
        beats = _start(2, 1.0, reports, address=lambda r: "192.0.2.1" if r == 0 else "127.0.0.1")
        try:
            deadline = time.monotonic() + 30
            while "no heartbeat ever arrived" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "no heartbeat ever arrived from rank 1 on host host1" in caplog.text
            assert not reports.reasons
        finally:
            for b in beats:
                b.stop()


def test_large_worlds_watch_ring_neighbours_only():
    assert liveness.watched_peers(1, 4) == [0, 2, 3]
    assert liveness.watched_peers(0, 200) == [1, 2, 198, 199]
    assert liveness.watched_peers(100, 200) == [98, 99, 101, 102]


def test_large_worlds_read_the_records_at_power_of_two_distances_and_a_notice_floods_them_all():
    assert liveness.contacted_peers(1, 4) == [0, 2, 3]
    assert liveness.contacted_peers(0, 200) == [1, 2, 4, 8, 16, 32, 64, 72, 128, 136, 168, 184, 192,
                                                196, 198, 199]
    for size in (65, 1000, 16384):
        links = {r: liveness.contacted_peers(r, size) for r in range(size)}
        assert max(len(v) for v in links.values()) <= 2 * size.bit_length()
        assert all(set(liveness.watched_peers(r, size)) <= set(links[r]) for r in range(0, size, 97))
        # A notice forwarded once by every rank that gets it reaches all, in about log2(N) hops.
        reached, frontier, hops = {0}, {0}, 0
        while frontier:
            frontier = {p for r in frontier for p in links[r]} - reached
            reached |= frontier
            hops += frontier != set()
        assert len(reached) == size
        assert hops <= size.bit_length()


class _CountingStore:
    """A HashStore that counts the requests each rank makes (each rank's calls come on its thread)."""

    def __init__(self) -> None:
        self._store = dist.HashStore()
        self.calls: dict[int, int] = {}
        self._local = threading.local()

    def rank_is(self, rank: int) -> None:
        self._local.rank = rank

    def __getattr__(self, name: str):
        method = getattr(self._store, name)

        def counted(*args, **kwargs):
            rank = self._local.rank
            self.calls[rank] = self.calls.get(rank, 0) + 1
            return method(*args, **kwargs)
        return counted


@pytest.mark.parametrize("size", [2, 8, 32, 80])
def test_setting_up_costs_each_rank_the_same_few_store_requests_at_any_size(size, monkeypatch):
    store = _CountingStore()
    reports = _Reports(size)
    original = liveness.Heartbeats.start

    def start(store_arg, rank, *args, **kwargs):
        store.rank_is(rank)
        return original(store_arg, rank, *args, **kwargs)

    monkeypatch.setattr(liveness.Heartbeats, "start", start)
    beats = _start(size, 30.0, reports, store=store)
    for b in beats:
        b.stop()
    # publish, wait for the records, read them in one request (rank 0 also publishes the nonce)
    assert store.calls == {r: 3 + (r == 0) for r in range(size)}


def test_in_a_large_world_every_rank_hears_of_a_failure_with_the_failed_rank_named(monkeypatch):
    monkeypatch.setattr(liveness, "FULL_WATCH_RANKS", 4)
    size = 12
    reports = _Reports(size)
    beats = _start(size, 1.0, reports)
    try:
        assert liveness.contacted_peers(0, size) == [1, 2, 4, 8, 10, 11]  # 6 never read rank 0's record
        _silence(beats[0])
        for rank in range(1, size):
            assert reports.events[rank].wait(30), (rank, reports.reasons)
            assert reports.reasons[rank].startswith("rank 0 on host host0 has ")
        # Rank 6 neither watches rank 0 nor hears from its watchers directly: a forwarded notice
        # names rank 0 and the rank that noticed, with their hosts.
        assert re.fullmatch(r"rank 0 on host host0 has failed: rank (1|2|10|11) on host host\1 heard .*",
                            reports.reasons[6])
        assert 0 not in reports.reasons
        assert "rank 0 on host host0" not in beats[6].names.values()
    finally:
        for b in beats:
            b.stop()


class _StuckWork:
    """Gloo work whose peer never answers: every wait slice expires."""

    def __init__(self) -> None:
        self.waits = 0

    def wait(self, timeout: datetime.timedelta) -> bool:
        self.waits += 1
        time.sleep(timeout.total_seconds() / 10)
        raise RuntimeError("Operation timed out!")

    def is_completed(self) -> bool:
        return False


def test_a_wait_on_gloo_work_ends_once_the_job_is_aborted():
    abort = liveness.Abort()
    work = _StuckWork()
    threading.Timer(0.3, abort.trigger, args=("rank 1 on host b has given no sign of life",)).start()
    with pytest.raises(ControlPlaneError, match="abandoned: rank 1 on host b has given no sign of life"):
        liveness.wait_work(work, abort)
    assert work.waits >= 2  # expired slices were waited again, not taken for a failure


def test_a_long_wait_on_live_peers_is_not_silent(monkeypatch, caplog):
    monkeypatch.setattr(liveness, "LONG_WAIT_S", 0.0)
    abort = liveness.Abort()
    threading.Timer(0.3, abort.trigger, args=("stop",)).start()
    with caplog.at_level("WARNING", logger="ringtrain.engine"), pytest.raises(ControlPlaneError):
        liveness.wait_work(_StuckWork(), abort, what="an allgather")
    assert caplog.text.count("an allgather has waited") == 1


def test_a_failed_gloo_work_raises_its_own_error():
    class Failed(_StuckWork):
        def wait(self, timeout):
            raise RuntimeError("Connection closed by peer")

        def is_completed(self):
            return True

    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        liveness.wait_work(Failed(), liveness.Abort())


def test_work_completing_just_after_a_slice_expired_is_no_failure():
    # A late peer arriving at the end of a slice: the slice's wait times out, the work is complete.
    class JustDone(_StuckWork):
        waits = 0

        def wait(self, timeout):
            self.waits += 1
            if self.waits == 1:
                raise RuntimeError("Operation timed out!")

        def is_completed(self):
            return self.waits >= 1

    liveness.wait_work(JustDone(), liveness.Abort())


def test_abort_keeps_the_first_reason():
    abort = liveness.Abort()
    assert abort.trigger("first")
    assert not abort.trigger("second")
    assert abort.triggered
    assert abort.reason == "first"


# --- real ranks ------------------------------------------------------------------------------------

_WORKER = textwrap.dedent("""
    import os, sys, time
    import torch
    torch.set_num_threads(1)
    import ringtrain as hvd
    from ringtrain.exceptions import HorovodInternalError

    hvd.init()
    rank = hvd.rank()
    rng = __import__("random").Random(rank)
    sys.stdout.write(f"up {rank}\\n"); sys.stdout.flush()
    i = 0
    try:
        while True:
            # every path a wait can take: the round, the mesh, the socket ring, gloo
            kind = i % 4
            if kind == 0:
                hvd.allreduce(torch.ones(8), name=f"small{i}")
            elif kind == 1:
                hvd.allreduce(torch.ones(300_000), name=f"ring{i}")
            elif kind == 2:
                hvd.broadcast(torch.ones(200_000), 0, name=f"bcast{i}")
            else:
                hvd.allgather(torch.ones(1000, 3), name=f"gather{i}")
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.2)  # user code between collectives
            i += 1
            if i == 20:
                open(os.environ["READY_FILE"] + f".{rank}", "w").close()
    except HorovodInternalError as exc:
        sys.stdout.write(f"HorovodInternalError on rank {rank} at {time.time()!r}: {exc}\\n")
        sys.stdout.flush()
    hvd.shutdown()
    sys.stdout.write(f"exited {rank}\\n")
""")


def _spawn(size: int, tmp_path: Path, peer_timeout: str = "5") -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(size):
        env = {**os.environ, **rank_env(rank, size, port), "PYTHONPATH": str(REPO / "src"),
               "RINGTRAIN_PEER_TIMEOUT_SECONDS": peer_timeout, "READY_FILE": str(tmp_path / "ready")}
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def _wait_ready(tmp_path: Path, size: int, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"ready.{r}").exists() for r in range(size)):
        assert all(p.poll() is None for p in procs), [p.communicate()[0] for p in procs]
        assert time.monotonic() < deadline, "ranks did not start"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_every_survivor_raises_naming_the_rank_that_was_killed_or_hung(tmp_path, sig):
    size = 3
    procs = _spawn(size, tmp_path)
    victim = random.randrange(size)
    try:
        _wait_ready(tmp_path, size, procs)
        time.sleep(random.random())  # a random moment of the loop
        procs[victim].send_signal(sig)
        signalled = time.time()
        outputs = {}
        for rank, proc in enumerate(procs):
            if rank != victim:
                # hang guard only: detection takes RINGTRAIN_PEER_TIMEOUT_SECONDS (5 s) at most
                outputs[rank] = proc.communicate(timeout=120)[0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for rank, out in outputs.items():
        assert f"HorovodInternalError on rank {rank}" in out, out
        raised = float(out.split(f"HorovodInternalError on rank {rank} at ", 1)[1].split(":", 1)[0])
        print(f"rank {rank} raised {raised - signalled:.1f} s after rank {victim} got {sig.name}")
        assert f"rank {victim} on host {socket.gethostname()}" in out, out
        assert f"exited {rank}" in out, out


def test_with_a_secret_nobody_without_it_can_forge_a_failure_notice():
    # An outsider that even read the store's published value cannot make a FAIL datagram the ranks
    # accept; one made with the job's secret is accepted (so the check is what stops the first).
    reports = _Reports(2)
    store = dist.HashStore()
    secret = "s" * 64
    beats = _start(2, 30.0, reports, secret=secret, store=store)
    try:
        published = bytes.fromhex(store.get("live/nonce").decode())
        assert liveness.job_nonce(published, secret, "test/gen1") != published
        assert liveness.job_nonce(published, "t" * 64, "test/gen1") != liveness.job_nonce(published, secret,
                                                                                          "test/gen1")
        port = beats[0]._sock.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as outsider:
            forged = liveness._DATAGRAM.pack(liveness._MAGIC, published, liveness._FAIL, 1, 1)
            for _ in range(20):
                outsider.sendto(forged, ("127.0.0.1", port))
            assert not reports.events[0].wait(2.0), reports.reasons
            value = liveness.job_nonce(published, secret, "test/gen1")
            genuine = liveness._DATAGRAM.pack(liveness._MAGIC, value, liveness._FAIL, 1, 1)
            outsider.sendto(genuine, ("127.0.0.1", port))
            assert reports.events[0].wait(30), "a notice with the job's value must be taken"
    finally:
        for b in beats:
            b.stop()
