"""The worker side of an elastic job: joining generations, leaving them, removal, stop, abandoned
generations and host updates, against a real job store in this process."""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch.distributed as dist

from ringtrain.engine import elastic_rendezvous as rdzv
from ringtrain.engine import job_store
from ringtrain.exceptions import ElasticWorkerExit

SECRET = "b" * 64
HOROVOD_NAMES = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                 "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


@pytest.fixture
def driver() -> Iterator[job_store.JobStore]:
    """The driver's end: a job store server and a client of it."""
    with job_store.JobStoreServer(SECRET) as server:
        store = job_store.JobStore(server.address, SECRET, timeout=30.0)
        yield store
        store.close()


@pytest.fixture
def client(driver: job_store.JobStore, monkeypatch: pytest.MonkeyPatch) -> rdzv.WorkerClient:
    for name in HOROVOD_NAMES:  # join() sets them, as Horovod's reset does; restored after the test
        monkeypatch.setenv(name, "unset")
    connection = job_store.JobStore(driver.address, SECRET, timeout=30.0)
    return rdzv.WorkerClient("w2", connection, first_generation=1)


def publish(store: job_store.JobStore, generation: int, workers: dict[str, rdzv.Slot],
            updates: int = 0) -> None:
    store.set(rdzv.assignment_key(generation), rdzv.Assignment(generation, updates, workers).to_json())
    store.set(rdzv.CURRENT, str(generation))


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; the list gets its result or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def finish(thread: threading.Thread, out: list[Any]) -> Any:
    thread.join(timeout=60)
    assert not thread.is_alive(), "join() did not return"
    return out[0]


TWO = {"w1": rdzv.Slot("hostA", 0, 2, 0, 1, 0, 2), "w2": rdzv.Slot("hostB", 1, 2, 0, 1, 1, 2)}


def test_assignment_json_round_trip():
    assignment = rdzv.Assignment(3, 2, TWO)
    back = rdzv.Assignment.from_json(assignment.to_json())
    assert back == assignment
    assert back.size == 2


def test_enabled_only_with_a_worker_id():
    assert rdzv.enabled({rdzv.ENV_WORKER: "w1"})
    assert not rdzv.enabled({})
    assert not rdzv.enabled({rdzv.ENV_WORKER: " "})


def test_join_waits_for_its_generation_and_takes_its_place_from_there(driver, client):
    thread, out = in_thread(lambda: client.join(30.0))
    publish(driver, 1, TWO)
    world = finish(thread, out)
    assert (world.rank, world.size, world.local_rank, world.local_size, world.cross_rank, world.cross_size,
            world.hostname) == (1, 2, 0, 1, 1, 2, "hostB")
    assert world.main_address == "127.0.0.1"
    world.store.set("ctrl/token", "t")  # the engine's keys live under the generation's prefix
    assert driver.get("elastic/gen/1/engine/ctrl/token") == b"t"
    assert (os.environ["HOROVOD_RANK"], os.environ["HOROVOD_SIZE"], os.environ["HOROVOD_HOSTNAME"]) == \
        ("1", "2", "hostB")


def test_joining_again_reports_leaving_and_takes_the_next_generation(driver, client):
    publish(driver, 1, TWO)
    client.join(30.0)
    assert not driver.check([rdzv.left_key(1, "w2")])
    thread, out = in_thread(lambda: client.join(30.0))
    driver.wait([rdzv.left_key(1, "w2")])
    publish(driver, 2, {"w2": rdzv.Slot("hostB", 0, 1, 0, 1, 0, 1)})
    world = finish(thread, out)
    assert driver.add(rdzv.left_count_key(1), 0) == 1  # counted after the key: the driver polls the count
    assert (world.rank, world.size) == (0, 1)
    world.store.set("k", "v")
    assert driver.check(["elastic/gen/2/engine/k"])


def test_a_worker_left_out_of_the_generation_exits_with_0(driver, client):
    publish(driver, 1, {"w1": TWO["w1"]})
    with pytest.raises(ElasticWorkerExit, match="no place in generation 1") as info:
        client.join(30.0)
    assert info.value.exit_code == 0


def test_a_stopping_job_ends_waiting_workers_with_1(driver, client):
    thread, out = in_thread(lambda: client.join(30.0))
    driver.set(rdzv.STOP, "the driver is ending the job")
    exc = finish(thread, out)
    assert isinstance(exc, ElasticWorkerExit)
    assert exc.exit_code == 1
    assert "the driver is ending the job" in str(exc)


def test_waits_of_an_abandoned_generation_fail_at_once(driver):
    store = rdzv.GenerationStore(job_store.JobStore(driver.address, SECRET, timeout=30.0), 4, timeout_s=300.0)
    prefixed = dist.PrefixStore("engine/", store)  # as the engine uses it: C++ calls back into Python
    thread, out = in_thread(lambda: prefixed.get("ctrl/addr/1"))
    driver.set(rdzv.abort_key(4), "worker w7 failed")
    exc = finish(thread, out)
    assert isinstance(exc, dist.DistStoreError)
    assert "generation 4 of the elastic job was abandoned" in str(exc)
    assert "worker w7 failed" in str(exc)


def test_generation_store_is_a_store(driver):
    store = rdzv.GenerationStore(job_store.JobStore(driver.address, SECRET, timeout=30.0), 1, timeout_s=30.0)
    store.set("a", "1")
    assert store.get("a") == b"1"
    assert store.add("n", 2) == 2
    assert store.check(["a"])
    assert store.multi_get(["a", "n"]) == [b"1", b"2"]
    store.wait(["a"])
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.wait(["missing"], datetime.timedelta(seconds=0.2))


def test_host_updates_newer_than_the_generation_reach_the_listeners(driver, client):
    driver.set(rdzv.update_key(1), json.dumps({"timestamp": 10.0, "result": 2}))
    publish(driver, 1, TWO, updates=1)  # update 1 is part of generation 1 already
    client.join(30.0)
    got: list[tuple[float, int]] = []
    arrived = threading.Event()

    def listener(timestamp: float, result: int) -> None:
        got.append((timestamp, result))
        arrived.set()

    client.add_listener(listener)
    driver.set(rdzv.update_key(2), json.dumps({"timestamp": 20.0, "result": 1}))
    assert arrived.wait(60)
    assert got == [(20.0, 1)]
    client.remove_listener(listener)


def test_updates_heard_while_re_forming_stay_pending_until_a_generation_includes_them(driver, client):
    publish(driver, 1, TWO)
    client.join(30.0)
    arrived = threading.Event()
    client.add_listener(lambda timestamp, result: arrived.set())
    driver.set(rdzv.update_key(1), json.dumps({"timestamp": 30.0, "result": 2}))
    assert arrived.wait(60)
    assert client.pending_updates() == [(30.0, 2)]  # State.on_reset puts these back after a reset
    thread, out = in_thread(lambda: client.join(30.0))
    publish(driver, 2, TWO, updates=1)  # generation 2 was formed with update 1 in it
    finish(thread, out)
    assert client.pending_updates() == []
