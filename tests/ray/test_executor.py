"""``RayExecutor`` on a real local Ray cluster (one per module: Ray's start-up takes seconds).

The arguments' checks need no cluster and run in the fast lane; everything that starts Ray is ``slow``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.engine import job_store  # noqa: E402
from ringtrain.exceptions import AuthenticationError  # noqa: E402
from ringtrain.ray import RayExecutor  # noqa: E402
from ringtrain.ray.cluster import PlacementTimeoutError  # noqa: E402
from ringtrain.ray.executor import WorkerLostError  # noqa: E402
from tests.ray.local_cluster import start_local_ray  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPUS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster of two CPUs; its workers can import this test module (by reference)."""
    yield start_local_ray(CPUS, ROOT)
    ray.shutdown()


@pytest.fixture
def executor(cluster: str) -> Iterator[RayExecutor]:
    made = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=2)
    made.start(extra_env_vars={"RAY_TEST_VARIABLE": "seen"})
    yield made
    made.shutdown()


# --- functions the workers run ---------------------------------------------------------------------

def world() -> tuple[int, ...]:
    import torch

    import ringtrain as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum).item()
    return (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size(),
            total)


def job_facts() -> tuple[str | None, str | None, str | None]:
    return (os.environ.get("RINGTRAIN_JOB_SECRET"), os.environ.get("RINGTRAIN_JOB_STORE"),
            os.environ.get("RAY_TEST_VARIABLE"))


def add(a: int, b: int = 0) -> int:
    return a + b + int(os.environ["RANK"]) * 100


def rank1_dies_while_rank0_waits() -> float:
    import torch

    import ringtrain as hvd

    hvd.init()
    if hvd.rank() == 1:
        os._exit(3)
    return hvd.allreduce(torch.ones(1)).item()


def rank0_raises() -> int:
    if os.environ["RANK"] == "0":
        raise KeyError("the user's own error")
    return 1


class Counter:
    def __init__(self, start: int) -> None:
        self.value = start + int(os.environ["RANK"])

    def bump(self) -> int:
        self.value += 1
        return self.value


def report(counter: Counter) -> int:
    """Logs three values (rank 0's reach the callbacks) and one of every rank's (chief_only=False)."""
    from ringtrain.ray import ray_logger

    for step in range(3):
        ray_logger.log({"step": step, "value": counter.value})
    ray_logger.log({"all": counter.value}, chief_only=False)
    return counter.value


# --- the argument checks (no cluster) ---------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "match"), [
    ({}, "needs num_workers"),
    ({"num_workers": 2, "num_hosts": 2}, "give one of them"),
    ({"num_workers": 0}, "num_workers=0"),
    ({"num_hosts": 2, "num_workers_per_host": 0}, "num_workers_per_host=0"),
    ({"num_workers": 2, "cpus_per_worker": 0}, "cpus_per_worker=0"),
    ({"num_workers": 2, "gpus_per_worker": 1}, "without use_gpu"),
    ({"num_workers": 2, "use_gpu": True, "gpus_per_worker": -1}, "gpus_per_worker=-1"),
    ({"max_workers": 4}, "needs a positive min_workers"),
    ({"num_workers": 2, "min_workers": 1}, "either elastic or fixed-size"),
])
def test_bad_arguments_are_named(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RayExecutor(RayExecutor.create_settings(), **kwargs)


def test_settings_must_come_from_create_settings() -> None:
    with pytest.raises(TypeError, match="create_settings"):
        RayExecutor({"timeout_s": 5}, num_workers=2)


def test_calls_before_start_say_so() -> None:
    executor = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    for call in (lambda: executor.run(add, [1]), lambda: executor.execute(id),
                 lambda: executor.run_remote(add), lambda: executor.execute_single(id)):
        with pytest.raises(RuntimeError, match="before start"):
            call()
    executor.shutdown()  # harmless before start


# --- on the cluster ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_gives_every_rank_its_place_and_the_secret_and_a_users_error_keeps_its_type(
        executor: RayExecutor) -> None:
    """One executor for three checks (each start costs two workers their Ray and torch imports): the
    ranks' places and results, the job's secret, and last, since a failed run stops the workers, a
    user's error raised with its own type."""
    # every rank its place, the results in rank order
    assert executor.run(world) == [(0, 2, 0, 2, 0, 1, 3.0), (1, 2, 1, 2, 0, 1, 3.0)]
    assert executor.run(add, args=[1], kwargs={"b": 2}) == [3, 103]
    assert ray.get(executor.run_remote(add, [5])) == [5, 105]
    # the secret travels inside Ray and guards the job store
    facts = executor.run(job_facts)
    secrets = {f[0] for f in facts}
    assert len(secrets) == 1
    assert None not in secrets
    secret = secrets.pop()
    assert [f[2] for f in facts] == ["seen", "seen"]  # extra_env_vars
    assert os.environ.get("RINGTRAIN_JOB_SECRET") != secret  # the driver's own environment is untouched
    # what an actor reports of its environment leaves the secret out
    reported = ray.get(executor.workers[0].env_vars.remote())
    assert "RINGTRAIN_JOB_SECRET" not in reported
    assert reported["RANK"] == "0"
    # the job store the workers were pointed at answers only the secret's holders
    address = facts[0][1]
    with pytest.raises(AuthenticationError):
        job_store.JobStore(address, "not-the-secret", timeout=10.0)
    store = job_store.JobStore(address, secret, timeout=10.0)
    store.set("probe", "1")
    assert store.get("probe") == b"1"
    store.close()
    # a user's error keeps its type and names the rank
    with pytest.raises(KeyError, match="the user's own error") as caught:
        executor.run(rank0_raises)
    assert any("raised by rank 0 on Ray node" in note for note in getattr(caught.value, "__notes__", []))


@pytest.mark.slow
def test_execute_drives_a_stateful_executable(cluster: str) -> None:
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=2)
    executor.start(executable_cls=Counter, executable_args=[10])
    try:
        assert executor.execute(lambda counter: counter.bump()) == [11, 12]
        assert executor.execute(lambda counter: counter.bump()) == [12, 13]
        assert executor.execute_single(lambda counter: counter.value) == 12
        # what the ranks log reaches the callbacks here, every callback, rank 0's values in their order
        seen: list = []
        also: list = []
        assert executor.execute(report, callbacks=[seen.append, also.append]) == [12, 13]
        assert [v for v in seen if "step" in v] == [{"step": s, "value": 12} for s in range(3)]
        assert sorted(v["all"] for v in seen if "all" in v) == [12, 13]
        assert also == seen
        # a callback's error is raised once the call is over; the workers stay usable
        with pytest.raises(ZeroDivisionError):
            executor.execute(report, callbacks=[lambda value: 1 / 0])
        assert executor.execute_single(lambda counter: counter.value) == 12
        with pytest.raises(ValueError, match="nobody would call its callbacks"):
            executor.run_remote(report, callbacks=[seen.append])
    finally:
        executor.shutdown()


@pytest.mark.slow
def test_a_dying_worker_ends_run_naming_rank_and_node(executor: RayExecutor) -> None:
    node_ip = ray.util.get_node_ip_address()
    began = time.monotonic()
    with pytest.raises(WorkerLostError, match=rf"rank 1 on Ray node {node_ip} \(host .*died during run"):
        executor.run(rank1_dies_while_rank0_waits)
    assert time.monotonic() - began < 60  # the bound for a fixed-size job
    assert executor.workers == []
    # the cluster's room came back: the same executor starts again and works
    executor.start()
    assert [r[0] for r in executor.run(world)] == [0, 1]


# --- elastic (min_workers / ElasticRayExecutor): one run, a worker lost once --------------------------

def count_steps(steps: int) -> dict:
    """Each step adds the world's size to ``total`` (an allreduce) and commits; worker w2 dies once,
    just after its third commit."""
    import torch

    import ringtrain as hvd
    from ringtrain.ray import ray_logger

    hvd.init()
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0, total=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.ObjectState) -> None:
        while state.step < steps:
            state.total += int(hvd.allreduce(torch.tensor(1), op=hvd.Sum, name="one").item())
            state.step += 1
            ray_logger.log({"step": state.step})  # rank 0's, for the driver's callbacks
            state.commit()
            if state.step == 3 and os.environ.get("RINGTRAIN_ELASTIC_WORKER") == "w2":
                sys.stdout.flush()
                os._exit(1)

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "total": state.total,
            "worker": os.environ.get("RINGTRAIN_ELASTIC_WORKER"), "env": os.environ.get("RAY_TEST_VARIABLE"),
            "nice": os.getpriority(os.PRIO_PROCESS, 0)}


@pytest.mark.slow
def test_elastic_run_replaces_a_lost_worker_and_restores_its_state(cluster: str, capfd) -> None:
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=1, max_workers=2,
                           elastic_timeout=60)
    executor.start(extra_env_vars={"RAY_TEST_VARIABLE": "seen"})
    logged: list = []
    results = executor.run(count_steps, args=[6], callbacks=[logged.append])
    err = capfd.readouterr().err
    # both CPUs held from the start (max 2); w2 died after step 3 (committed: 3 steps of 2), w3 took its
    # place and got the state from rank 0: 3 more steps of 2. The ranks ran at the niceness of the
    # cluster's raylet (this process's), not at Ray's worker niceness (15): the agent actors' options
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    common = {"size": 2, "step": 6, "total": 12, "env": "seen", "nice": nice}
    assert results == [{"rank": 0, "worker": "w1", **common}, {"rank": 1, "worker": "w3", **common}], err
    assert "worker w2 (rank 1 on" in err
    # rank 0's values reached the callback while the job ran, through the executor's job store (a step
    # may come twice: a step whose commit failed with the lost worker is done again after the restore)
    assert {value["step"] for value in logged} == set(range(1, 7)), logged


@pytest.mark.slow
def test_placement_the_cluster_cannot_fit_names_asked_and_offered(cluster: str) -> None:
    settings = RayExecutor.create_settings(placement_group_timeout_s=1)
    executor = RayExecutor(settings, num_workers=CPUS + 1)
    with pytest.raises(PlacementTimeoutError, match=r"3 bundle\(s\) of \{CPU: 1\} \(PACK\).*has \{CPU: 2\}"):
        executor.start()
    spread = RayExecutor(settings, num_hosts=2, num_workers_per_host=1)
    with pytest.raises(PlacementTimeoutError, match=r"STRICT_SPREAD.*on 1 node"):
        spread.start()
    # nothing was left reserved: a job that fits starts at once
    fits = RayExecutor(settings, num_workers=CPUS)
    fits.start()
    fits.shutdown()


@pytest.mark.slow
def test_horovods_ray_examples_run_unmodified_through_the_shim(cluster: str) -> None:
    env = {**os.environ, "RAY_ADDRESS": cluster}
    result = subprocess.run([sys.executable, "-m", "ringtrain.shim", str(Path(__file__).with_name(
        "horovod_ray_examples.py"))], capture_output=True, text=True, env=env, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stateless run: ranks [0, 1]" in result.stdout
    assert "stateful execute: first loss" in result.stdout
    assert "DistributedOptimizer training: loss" in result.stdout
