"""Rendezvous and the engine's own process groups (engine/world_rendezvous.py), in one process and in two."""

from __future__ import annotations

import datetime
import socket
import struct
import threading

import pytest
import torch
import torch.distributed as dist

from ringtrain.engine import world_rendezvous
from ringtrain.env.single import SingleProcessEnvironment
from ringtrain.env.torchrun import EnvVarsEnvironment
from ringtrain.exceptions import AuthenticationError
from tests.ranks import free_port, run_ranks


@pytest.fixture
def alone(monkeypatch):
    """This process as a world of one, whatever the test runner's environment holds."""
    assert not (dist.is_available() and dist.is_initialized()), "a default process group leaked"
    monkeypatch.setattr(world_rendezvous, "detect_environment", lambda: SingleProcessEnvironment({}))


def test_a_single_process_needs_no_network(alone):
    world = world_rendezvous.rendezvous(timeout_s=5.0)
    assert (world.rank, world.size, world.local_rank, world.local_size) == (0, 1, 0, 1)
    assert (world.cross_rank, world.cross_size) == (0, 1)
    assert not world.reused_torch_world
    world.store.set("key", "value")
    assert world.store.get("key") == b"value"


def test_each_rendezvous_is_a_new_generation_on_the_same_base_store(alone):
    first = world_rendezvous.rendezvous(timeout_s=5.0)
    first.store.set("seen", "1")
    second = world_rendezvous.rendezvous(timeout_s=5.0)
    # A key of an earlier generation is invisible to the next one: nothing of a dead attempt is read.
    with pytest.raises(dist.DistStoreError):
        second.store.wait(["seen"], datetime.timedelta(milliseconds=50))
    assert first.store.get("seen") == b"1"


def test_gloo_group_of_one_and_nonmembers(alone):
    world = world_rendezvous.rendezvous(timeout_s=5.0)
    group = world_rendezvous.make_gloo_group(world, "unit", [0], timeout_s=5.0)
    tensor = torch.ones(3)
    group.allreduce([tensor]).wait()
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    assert world_rendezvous.make_gloo_group(world, "unit-other", [1, 2], timeout_s=5.0) is None
    assert world_rendezvous.make_nccl_group(world, "unit-other", [1], timeout_s=5.0) is None


def test_an_unreachable_store_names_address_rank_and_fix(monkeypatch):
    port = free_port()  # nothing listens there
    environ = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    monkeypatch.setattr(world_rendezvous, "detect_environment", lambda: EnvVarsEnvironment(environ))
    with pytest.raises(ValueError, match=rf"cannot reach the rendezvous store at 127\.0\.0\.1:{port} "
                                         r"\(rank 1 of 2\).*HINT: check MASTER_ADDR/MASTER_PORT"):
        world_rendezvous.rendezvous(timeout_s=1.0)


def test_under_torchrun_rank_zero_does_not_host_the_store(monkeypatch):
    """With TORCHELASTIC_USE_AGENT_STORE the agent hosts it: rank 0 connects like everyone else."""
    port = free_port()
    environ = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    monkeypatch.setattr(world_rendezvous, "detect_environment", lambda: EnvVarsEnvironment(environ))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    with pytest.raises(ValueError, match=r"cannot reach the rendezvous store .*\(rank 0 of 2\)"):
        world_rendezvous.rendezvous(timeout_s=1.0)


def _two_rank_rendezvous() -> dict:
    world = world_rendezvous.rendezvous(timeout_s=30.0)
    world.store.set(f"from{world.rank}", str(world.rank))
    other = world.store.get(f"from{1 - world.rank}").decode()
    group = world_rendezvous.make_gloo_group(world, "pair", [0, 1], timeout_s=30.0)
    tensor = torch.tensor([float(world.rank + 1)])
    group.allreduce([tensor]).wait()
    return {"rank": world.rank, "size": world.size, "local_size": world.local_size, "other": other,
            "sum": tensor.item(), "address": world.main_address}


@pytest.mark.slow
def test_two_ranks_meet_through_rank_zeros_store():
    results = run_ranks(2, _two_rank_rendezvous)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["local_size"] == 2 for r in results)
    assert [r["other"] for r in results] == ["1", "0"]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert all(r["address"] == "127.0.0.1" for r in results)


# ------------------------------------------------------------------------ the job store in real ranks
def _where_is_the_store(master_port: int | None = None) -> dict:
    import os

    from ringtrain.engine import auth

    if master_port is not None:  # (the rank fixture gives every call a fresh MASTER_PORT otherwise)
        os.environ["MASTER_PORT"] = str(master_port)
    world = world_rendezvous.rendezvous(timeout_s=30.0)
    world.store.set(f"k{world.rank}", "x")
    world.store.wait([f"k{1 - world.rank}"])
    group = world_rendezvous.make_gloo_group(world, "pair", [0, 1], timeout_s=30.0)
    tensor = torch.tensor([1.0])
    group.allreduce([tensor]).wait()
    base = [s for key, s in world_rendezvous._BASE_STORES.items() if key[0] != ""][-1]
    return {"base": type(base).__name__, "address": getattr(base, "address", ""),
            "servers": [s.address for s in world_rendezvous._SERVERS.values()], "scope": world.scope,
            "secret": world.secret is not None, "warned": auth._warned, "sum": tensor.item()}


@pytest.mark.slow
def test_without_a_launcher_rank_zero_hosts_the_job_store_on_loopback():
    results = run_ranks(2, _where_is_the_store)
    assert [r["base"] for r in results] == ["JobStore", "JobStore"]
    assert [r["sum"] for r in results] == [2.0, 2.0]
    # rank 0 listens on MASTER_ADDR (127.0.0.1 here) and the other ranks connect there
    assert results[0]["servers"] == [results[1]["address"]]
    assert results[0]["servers"][0].startswith("127.0.0.1:")
    assert results[1]["servers"] == []
    assert all(r["secret"] and not r["warned"] for r in results)
    assert results[0]["scope"] == "ringtrain/job/attempt0/gen1"


@pytest.mark.slow
def test_without_a_secret_the_job_runs_and_rank_zero_warns_once():
    results = run_ranks(2, _where_is_the_store, env={"RINGTRAIN_JOB_SECRET": ""})
    assert [r["sum"] for r in results] == [2.0, 2.0]
    assert [r["secret"] for r in results] == [False, False]
    assert [r["warned"] for r in results] == [True, False]


def test_the_unauthenticated_warning_is_one_line_with_the_fix(capsys, monkeypatch):
    from ringtrain.engine import auth

    monkeypatch.setattr(auth, "_warned", False)
    auth.warn_unauthenticated("this job of 4 ranks")
    auth.warn_unauthenticated("this job of 4 ranks")
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "this job of 4 ranks runs unauthenticated: RINGTRAIN_JOB_SECRET is not set" in err
    assert "HINT: start it with `ringtrain run`" in err
    assert "export RINGTRAIN_JOB_SECRET=" in err


@pytest.mark.slow
def test_ranks_use_the_launchers_job_store(tmp_path):
    from ringtrain.engine import job_store

    secret = job_store.new_secret()
    with job_store.JobStoreServer(secret) as server:
        env = {"RINGTRAIN_JOB_STORE": server.address, "RINGTRAIN_JOB_SECRET": secret,
               "TORCHELASTIC_RUN_ID": "run7", "TORCHELASTIC_RESTART_COUNT": "2"}
        results = run_ranks(2, _where_is_the_store, env=env)
        assert [r["address"] for r in results] == [server.address] * 2
        assert [r["servers"] for r in results] == [[], []]  # nobody but the launcher hosts it
        assert results[0]["scope"] == "ringtrain/run7/attempt2/gen1"
        client = job_store.JobStore(server.address, secret, timeout=10.0)
        assert client.get("ringtrain/run7/attempt2/gen1/k0") == b"x"


def _dead_attempt_keys_are_invisible() -> bool:
    world = world_rendezvous.rendezvous(timeout_s=30.0)
    # attempt 0 left its keys; attempt 1 must not see them
    return world.store.check(["k0"]) or world.store.check(["k1"])


@pytest.mark.slow
def test_a_restarted_attempt_never_reads_the_keys_of_a_dead_one():
    from ringtrain.engine import job_store

    secret = job_store.new_secret()
    with job_store.JobStoreServer(secret) as server:
        env = {"RINGTRAIN_JOB_STORE": server.address, "RINGTRAIN_JOB_SECRET": secret,
               "TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0"}
        run_ranks(2, _where_is_the_store, env=env)
        env["TORCHELASTIC_RESTART_COUNT"] = "1"
        assert run_ranks(2, _dead_attempt_keys_are_invisible, env=env) == [False, False]


@pytest.mark.slow
def test_under_torchrun_rank_zero_publishes_its_job_store_through_the_agents_store():
    agent = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "tr",
           "TORCHELASTIC_RESTART_COUNT": "0"}
    results = run_ranks(2, _where_is_the_store, agent.port, env=env)
    published = agent.get("ringtrain/tr/attempt0/job_store").decode()
    assert results[0]["servers"] == [published]
    assert results[1]["address"] == published
    assert published.startswith("127.0.0.1:")  # one host: loopback
    # torch's store (which anybody can read) holds the address, never the job's keys
    assert not agent.check(["ringtrain/tr/attempt0/gen1/k0"])
    assert agent.num_keys() <= 2


# ------------------------------------------------------------------------ gloo's listening sockets
class _HeldStore(dist.Store):
    """A store that answers reads only once the test lets it (to act between gloo's setup steps)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, bytes] = {}
        self.released = threading.Event()
        self._changed = threading.Condition()

    def set(self, key, value):
        with self._changed:
            self.values[key] = value.encode() if isinstance(value, str) else bytes(value)
            self._changed.notify_all()

    def get(self, key):
        self.wait([key])
        return self.values[key]

    def wait(self, keys, timeout=None):
        self.released.wait(60)
        with self._changed:
            if not self._changed.wait_for(lambda: all(k in self.values for k in keys), 60):
                raise dist.DistStoreError(f"no {keys}")

    def check(self, keys):
        return all(k in self.values for k in keys)


def _listening_port(blob: bytes) -> int:
    """The port of the first IPv4 loopback sockaddr in one rank's published gloo addresses."""
    at = blob.index(b"\x7f\x00\x00\x01") - 4  # family (2 bytes), port (2 bytes, network order), address
    return int.from_bytes(blob[at + 2:at + 4], "big")


def _hijacked_pair(secret: str | None) -> dict[int, object]:
    """Two ranks build a gloo group while a stranger answers for one of them on gloo's listener."""
    held = _HeldStore()
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        world = world_rendezvous.World(rank=r, size=2, local_rank=r, local_size=2, cross_rank=0, cross_size=1,
                            hostname="h", store=held, reused_torch_world=False, secret=secret,
                            scope="test")
        try:
            results[r] = world_rendezvous.make_gloo_group(world, "g", [0, 1], timeout_s=5.0)
        except BaseException as exc:  # handed to the test
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for _ in range(600):
        if len(held.values) >= 2:
            break
        threading.Event().wait(0.1)
    ports = {r: _listening_port(held.values[f"g//0/{r}"]) for r in range(2)}
    # One side waits for the other to dial and name a sequence number (which side depends on gloo's
    # version: the lower port, or the rank); the stranger names them all first, on both listeners.
    strangers = []
    for port in ports.values():
        for seq in range(8):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(struct.pack("<Q", seq))
            strangers.append(sock)
    held.released.set()
    for t in threads:
        t.join(120)
    for sock in strangers:
        sock.close()
    return results


def test_gloo_alone_pairs_a_stranger_with_a_rank():
    # Without the job's check (an unauthenticated job), gloo hands the stranger's connection to a
    # rank and both ranks believe the group is ready: what verify_gloo_group exists for.
    results = _hijacked_pair(secret=None)
    assert all(isinstance(g, dist.ProcessGroupGloo) for g in results.values()), results


@pytest.mark.slow  # two ranks and a stranger through gloo timeouts (5 s): outside the 4-minute lane
def test_a_gloo_connection_taken_by_a_stranger_fails_the_check_on_both_ranks():
    results = _hijacked_pair(secret="t" * 64)
    assert sorted(results) == [0, 1]
    for result in results.values():
        assert isinstance(result, AuthenticationError), results
        assert "gloo" in str(result)
        assert "HINT" in str(result)


def test_members_with_another_secret_fail_the_gloo_check():
    hashed = dist.HashStore()
    results: dict[int, object] = {}

    def rank(r: int) -> None:
        world = world_rendezvous.World(rank=r, size=2, local_rank=r, local_size=2, cross_rank=0, cross_size=1,
                            hostname="h", store=hashed, reused_torch_world=False,
                            secret=("a" if r == 0 else "b") * 64, scope="test")
        try:
            results[r] = world_rendezvous.make_gloo_group(world, "g", [0, 1], timeout_s=30.0)
        except BaseException as exc:
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in range(2):
        assert isinstance(results[r], AuthenticationError), results
        assert f"should lead to rank {1 - r}" in str(results[r])
        assert "did not prove the job's secret" in str(results[r])
