"""ringtrain's rendezvous handler: nodes as threads of this process, meeting on a real job store."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from ringtrain.engine.job_store import JobStore, JobStoreServer, new_secret
from ringtrain.exceptions import RendezvousFailedError, RendezvousMismatchError
from ringtrain.launch import rendezvous
from ringtrain.launch.rendezvous import NodeView, RingtrainRendezvous, describe_mismatch


@pytest.fixture
def server():
    secret = new_secret()
    with JobStoreServer(secret) as srv:
        srv.secret = secret
        yield srv


def view(rank: int, **changes) -> NodeView:
    base = NodeView(node_rank=rank, nnodes=2, nproc_per_node=(2, 2), run_id="job", port=29500,
                    host=f"host{rank}", pid=1000 + rank, ringtrain="0.1.0", torch="2.13.0", python="3.11")
    return replace(base, **changes)


def handler(server, v: NodeView, timeout: float = 60.0, node_timeout: float = 15.0) -> RingtrainRendezvous:
    store = JobStore(server.address, server.secret, timeout=10.0)
    return RingtrainRendezvous(store, v, bootstrap_host="127.0.0.1", timeout=timeout,
                               node_timeout=node_timeout)


def together(*calls):
    """Run each call in its own thread; return results (or the exception raised) in order."""
    def guarded(call):
        try:
            return call()
        except Exception as exc:  # the test looks at it
            return exc

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(guarded, calls))


def test_the_registry_creates_ours_and_refuses_without_a_store():
    params = RendezvousParameters(backend="ringtrain", endpoint="127.0.0.1:1", run_id="x", min_nodes=1,
                                  max_nodes=1)
    with pytest.raises(ValueError, match="started by `ringtrain run`"):
        get_rendezvous_handler(params)


def test_two_nodes_meet_and_every_round_has_its_own_store_and_a_fresh_port(server):
    nodes = [handler(server, view(0)), handler(server, view(1))]
    try:
        ports = []
        for round_ in range(3):
            infos = together(*(h.next_rendezvous for h in nodes))
            assert [(i.rank, i.world_size) for i in infos] == [(0, 2), (1, 2)]
            assert infos[0].bootstrap_store_info.master_port == infos[1].bootstrap_store_info.master_port
            assert infos[0].bootstrap_store_info.master_addr == "127.0.0.1"
            ports.append(infos[0].bootstrap_store_info.master_port)
            assert [h.round for h in nodes] == [round_] * 2
            # what the agents write in one round is invisible in the next
            infos[0].store.set("torchelastic/role_info/0", f"round {round_}")
            assert infos[1].store.get("torchelastic/role_info/0") == f"round {round_}".encode()
            if round_:
                assert not infos[1].store.check(["earlier"])
            infos[0].store.set("earlier", "x")
        assert len(set(ports)) == 3  # never a dead attempt's address
    finally:
        for h in nodes:
            h.shutdown()


def test_a_node_that_restarts_is_seen_waiting_by_the_others(server):
    nodes = [handler(server, view(0)), handler(server, view(1))]
    try:
        together(*(h.next_rendezvous for h in nodes))
        assert nodes[0].num_nodes_waiting() == 0
        joining = threading.Thread(target=nodes[1].next_rendezvous)
        joining.start()
        deadline = time.monotonic() + 30
        while nodes[0].num_nodes_waiting() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nodes[0].num_nodes_waiting() == 1  # torch's agent now restarts node 0's ranks too
        info = nodes[0].next_rendezvous()
        joining.join(timeout=30)
        assert (info.rank, nodes[0].round, nodes[1].round) == (0, 1, 1)
    finally:
        for h in nodes:
            h.shutdown()


@pytest.mark.parametrize(("changes", "words"), [
    ({"nnodes": 3}, ["--nnodes: 2 on node 0 (host0, pid 1000); 3 on node 1 (host1, pid 1001)"]),
    ({"nproc_per_node": (1, 1)}, ["--nproc-per-node", "2 on node 0", "1 on node 1"]),
    ({"run_id": "other"}, ["--rdzv-id", "job on node 0", "other on node 1"]),
    ({"ringtrain": "0.2.0"}, ["ringtrain version: 0.1.0 on node 0", "0.2.0 on node 1"]),
    ({"torch": "2.12.0"}, ["torch version"]),
    ({"port": 29501}, ["rendezvous port"]),
    ({"node_rank": 0}, ["--node-rank 0 is claimed by 2 nodes"]),
])
def test_a_mismatch_is_reported_on_every_node_with_what_differs(server, changes, words):
    first = handler(server, view(0))
    second = handler(server, view(1, **changes))
    try:
        results = together(first.next_rendezvous, second.next_rendezvous)
    finally:
        first.shutdown()
        second.shutdown()
    for result in results:
        assert isinstance(result, RendezvousMismatchError), result
        for word in words:
            assert word in str(result)
        assert "HINT:" in str(result)
    assert str(results[0]) == str(results[1])  # the same story on every node


def test_views_that_agree_describe_no_mismatch():
    assert describe_mismatch([view(0), view(1)]) is None


def test_a_node_that_gave_up_stops_the_others_running_and_waiting(server):
    nodes = [handler(server, view(0)), handler(server, view(1))]
    try:
        together(*(h.next_rendezvous for h in nodes))
        nodes[1].set_closed("node 1 (host1) gave up: its rank(s) 3 failed")
        # torch's agent asks every 0.1 s while its ranks run; the closed flag is looked at once a second
        deadline = time.monotonic() + 30
        with pytest.raises(RendezvousFailedError, match="node 1 \\(host1\\) gave up"):
            while time.monotonic() < deadline:
                nodes[0].num_nodes_waiting()
                time.sleep(0.1)
        with pytest.raises(RendezvousFailedError, match="gave up"):
            nodes[0].next_rendezvous()
    finally:
        for h in nodes:
            h.shutdown()


def test_node_0_gives_up_on_a_node_whose_heartbeat_stopped(server, monkeypatch):
    monkeypatch.setattr(rendezvous, "BEAT_INTERVAL", 0.2)
    nodes = [handler(server, view(0), node_timeout=2.0), handler(server, view(1))]
    try:
        together(*(h.next_rendezvous for h in nodes))
        nodes[1].shutdown()  # its agent dies: no more heartbeats, and it never joins round 1
        # told by the heartbeat, not by the 60 s rendezvous timeout ("did not join")
        with pytest.raises(RendezvousFailedError, match="node 1 stopped answering"):
            nodes[0].next_rendezvous()
    finally:
        nodes[0].shutdown()


def test_a_missing_node_ends_the_round_at_the_timeout_naming_it(server):
    alone = handler(server, view(0), timeout=1.0)
    try:
        with pytest.raises(RendezvousFailedError, match="node\\(s\\) 1 did not join round 0"):
            alone.next_rendezvous()
    finally:
        alone.shutdown()


def test_a_node_that_comes_after_the_round_formed_is_refused_alone(server):
    nodes = [handler(server, view(0)), handler(server, view(1))]
    late = handler(server, view(1, pid=4242, host="late"))
    try:
        together(*(h.next_rendezvous for h in nodes))
        with pytest.raises(RendezvousFailedError, match="already formed without this node"):
            late.next_rendezvous()
        assert not nodes[0].is_closed()  # the job goes on
    finally:
        for h in (*nodes, late):
            h.shutdown()


@pytest.mark.slow
def test_losing_node_0_is_named(server):
    other = handler(server, view(1))
    try:
        server.close()
        with pytest.raises(RendezvousFailedError, match="lost node 0"):
            other.next_rendezvous()
    finally:
        other.shutdown()


def test_the_endpoint_port_stays_the_job_stores_so_round_0_hands_the_workers_a_fresh_one():
    """torchrun's static rendezvous gives the workers ``MASTER_PORT`` = the ``--rdzv-endpoint`` port (its
    agent's unauthenticated TCPStore, which the workers join). ringtrain's node 0 serves the authenticated
    job store on that port for the whole job, so it cannot be the workers' store: round 0 already gets a
    fresh port, as every later round does (docs/launching.md, "The rendezvous port")."""
    import socket

    from ringtrain.exceptions import AuthenticationError, JobStoreError
    from ringtrain.launch.rendezvous import NodeMeeting

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = new_secret()
    meeting = NodeMeeting(view=view(0, nnodes=1, nproc_per_node=(1,), port=port),
                          endpoint=f"127.0.0.1:{port}", bootstrap_host="127.0.0.1", secret=secret,
                          timeout=30.0)
    configs = meeting.open()
    node = RingtrainRendezvous(configs["job_store"], configs["view"], "127.0.0.1", timeout=30.0)
    try:
        ports = [node.next_rendezvous().bootstrap_store_info.master_port for _ in range(2)]
        assert port not in ports
        assert len(set(ports)) == 2
        # the endpoint port answers only to the job's secret: no unauthenticated store came back
        with pytest.raises((AuthenticationError, JobStoreError)):
            JobStore(f"127.0.0.1:{port}", new_secret(), timeout=5.0).get("rdzv/closed")
    finally:
        node.shutdown()
        meeting.close(node)


class _CountingStore(JobStore):
    """A job store connection that counts its requests, by operation and key."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, str]] = []

    def add(self, key, value):
        self.calls.append(("add", key))
        return super().add(key, value)

    def get(self, key):
        self.calls.append(("get", key))
        return super().get(key)

    def check(self, keys):
        self.calls.append(("check", ",".join(keys)))
        return super().check(keys)


def test_small_jobs_poll_as_often_as_torchs_agent_asks_large_ones_stretch_within_a_budget():
    assert rendezvous.steady_intervals(2) == (1.0, 0.1, 1.0)
    assert rendezvous.steady_intervals(12) == (1.0, 0.1, 1.0)
    beat, waiting, closed = rendezvous.steady_intervals(1000)
    assert (beat, round(waiting, 2), round(closed, 2)) == (3.75, 8.33, 8.33)
    for nnodes in (2, 12, 64, 100, 300, 1000):
        beat, waiting, closed = rendezvous.steady_intervals(nnodes)
        assert beat <= rendezvous.NODE_TIMEOUT / 4  # node 0 still judges a silent node in time
        # While the job trains, what node 0's store answers, all agents together (heartbeats move only
        # while a round forms: the test below)
        per_second = nnodes * (1 / waiting + 1 / closed)
        assert per_second <= 250, (nnodes, per_second)


def test_a_node_beats_while_a_round_forms_and_once_it_sees_a_node_waiting(server, monkeypatch):
    monkeypatch.setattr(rendezvous, "BEAT_INTERVAL", 0.05)
    nodes = [handler(server, view(0)), handler(server, view(1))]
    probe = JobStore(server.address, server.secret, timeout=10.0)
    try:
        together(*(h.next_rendezvous for h in nodes))
        before = int(probe.add("rdzv/alive/1", 0))
        assert before >= 1  # it beat while round 0 formed
        restarting = threading.Thread(target=nodes[0].next_rendezvous)  # node 0 restarts: round 1 waits
        restarting.start()
        deadline = time.monotonic() + 30
        while nodes[1].num_nodes_waiting() == 0:  # what torch's agent asks on node 1 every 0.1 s
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while int(probe.add("rdzv/alive/1", 0)) == before:  # node 1 beats again: node 0 judges it now
            assert time.monotonic() < deadline
            time.sleep(0.05)
        nodes[1].next_rendezvous()
        restarting.join(timeout=30)
        assert [h.round for h in nodes] == [1, 1]
    finally:
        probe.close()
        for h in nodes:
            h.shutdown()


def test_between_two_looks_an_agent_answers_torch_from_what_it_read_last(server):
    store = _CountingStore(server.address, server.secret, timeout=10.0)
    big = RingtrainRendezvous(store, view(0, nnodes=1000), bootstrap_host="127.0.0.1", timeout=60.0)
    big.round = 0  # as after the first rendezvous
    for _ in range(50):  # five seconds of torch's agent asking every 0.1 s, asked at once
        assert big.num_nodes_waiting() == 0
    assert store.calls == [("add", "rdzv/round1/arrivals"), ("check", "rdzv/closed")]


def test_only_node_0_reads_the_views_while_a_round_forms(server):
    counted = _CountingStore(server.address, server.secret, timeout=10.0)
    nodes = [handler(server, view(0)),
             RingtrainRendezvous(counted, view(1), bootstrap_host="127.0.0.1", timeout=60.0)]
    try:
        infos = together(*(h.next_rendezvous for h in nodes))
        assert [i.rank for i in infos] == [0, 1]
        assert ("get", "rdzv/round0/views") not in counted.calls
    finally:
        for h in nodes:
            h.shutdown()
