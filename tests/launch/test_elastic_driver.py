"""The elastic driver's state machine (launch/elastic_driver.py), tick by tick, without processes.

The workers are fake groups (the driver's ``PLACES`` for local and ssh replaced, a fake ``RayHosts`` for
``--ray``), the job store a dict, the clock a number the test moves; discovery is the test calling
``registry.update``. A worker's moves (joining a generation, leaving it, exiting) are the keys its
real counterpart would set in the store and the exit code its group would report. The real jobs
these mirror are in tests/elastic/test_elastic_launch.py and tests/integration/.
"""

from __future__ import annotations

import io
import signal
import subprocess
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from ringtrain.engine import elastic_rendezvous as rdzv
from ringtrain.engine.auth import ENV_SECRET
from ringtrain.exceptions import UsageError
from ringtrain.launch import elastic_driver, hosts_backend, link, supervision
from ringtrain.launch.config import LaunchConfig
from ringtrain.launch.elastic_driver import ElasticDriver, Phase
from ringtrain.launch.elastic_hosts import DiscoveryError
from ringtrain.launch.elastic_worker import ENV_SECRET_ON_STDIN, UNREACHABLE_EXIT
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.ray.elastic import RayHosts

#: Host names the fake machine answers to (``is_local_host``); any other is "remote" (ssh).
LOCAL = {"localhost", "127.0.0.1"}
TWO = [("localhost", 1), ("127.0.0.1", 1)]


class FakeStore:
    """The job store's calls the driver makes, on a dict."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.keys[key] = value if isinstance(value, str) else value.decode()

    def add(self, key: str, amount: int) -> int:
        value = int(self.keys.get(key, "0")) + amount
        self.keys[key] = str(value)
        return value

    def check(self, keys: Sequence[str]) -> bool:
        return all(key in self.keys for key in keys)

    def close(self) -> None:
        pass


class FakeGroup(supervision.RankGroup):
    """A worker as the driver supervises it: the test sets its exit code and how its place ended."""

    kind = "fake"

    def __init__(self, host: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                 **_: Any) -> None:
        self.host = host
        self.argv = list(argv)
        self.env = dict(env or {})
        self.tail: list[str] = []
        self.ended_at = None
        self.code: int | None = None
        self.silent: float | None = None
        self.goes_silent = False
        self.not_started = False
        self.lost = False
        self.stopped = False
        self.proc = types.SimpleNamespace(args=["ssh", host, "..."], stdin=io.BytesIO())

    def poll(self) -> int | None:
        return self.code

    @property
    def pid(self) -> int:
        return 4000 + int(self.env.get(rdzv.ENV_WORKER, "w0")[1:])

    def wait(self, timeout: float | None = None) -> int:
        if self.code is None:
            raise subprocess.TimeoutExpired("fake", timeout or 0)
        return self.code

    def beat(self) -> None:
        pass

    def check_silence(self, limit: float) -> bool:
        if self.goes_silent and self.silent is None:
            self.silent = limit
            return True
        return False

    @property
    def silent_for(self) -> float | None:
        return self.silent

    def stop(self) -> None:
        self.stopped = True
        if self.code is None:
            self.code = -signal.SIGTERM

    def kill_ranks(self) -> None:
        self.kill()

    def kill(self) -> None:
        if self.code is None:
            self.code = -signal.SIGKILL

    def join_output(self, timeout: float) -> None:
        pass

    def unreachable(self) -> bool:
        return self.not_started

    def lost_contact(self) -> bool:
        return self.lost

    def describe_end(self, what: str) -> str:
        return f"{what} ended with its place ({self.host})"


class FakeRayHosts(RayHosts):
    """The Ray backend with its two Ray halves made up: the living nodes (``find``), and a worker's actor
    (``start``); what it gives the driver as a backend (launch/backend.py) is RayHosts' own."""

    def __init__(self, nodes: dict[str, int]) -> None:
        super().__init__(cpus_per_rank=1.0, gpus_per_rank=0.0, start_timeout=60.0)
        self.nodes = dict(nodes)
        self.started: list[tuple[str, int]] = []

    def release(self) -> None:
        pass  # no actor to kill

    def describe(self) -> str:
        return "the Ray cluster's living nodes (1 CPU(s) a slot)"

    def find(self) -> dict[str, int]:
        return dict(self.nodes)

    def start(self, host: str, argv: Sequence[str], env: Mapping[str, str], secret: str, rank: int,  # type: ignore[override]
              lock: Any, cwd: str | None = None) -> FakeGroup:
        self.started.append((host, rank))
        return FakeGroup(host, argv, env)


class Job:
    """An elastic driver over fakes; ``now`` is its clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hosts: Sequence[tuple[str, int]] = TWO, *,
                 num_proc: int = 2, min_np: int = 1, max_np: int | None = 2, timeout: float = 3.0,
                 reset_limit: int | None = None, cooldown: tuple[int, int] | None = None,
                 ray: FakeRayHosts | None = None, verbose: bool = False,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.now = 1000.0
        self.groups: dict[str, FakeGroup] = {}
        monkeypatch.setattr(hosts_backend, "PLACES", {"local": self._start, "ssh": self._start})
        monkeypatch.setattr(elastic_driver, "is_local_host", lambda host: host in LOCAL)
        monkeypatch.setattr(hosts_backend, "is_local_host", lambda host: host in LOCAL)
        monkeypatch.setattr(elastic_driver, "route_address", lambda host: "10.0.0.9")
        config = LaunchConfig(command=("python", "train.py"), num_proc=num_proc, min_np=min_np, max_np=max_np,
                              elastic_timeout=timeout, reset_limit=reset_limit, cooldown_range=cooldown,
                              hosts=tuple(HostSlots(h, s) for h, s in hosts), verbose=verbose)
        self.driver = ElasticDriver(config, {"PATH": "/usr/bin", "RANK": "7"}, backend=ray,
                                    clock=lambda: self.now, sleep=sleep or self.advance)
        self.store = FakeStore()
        self.driver.store = self.store  # type: ignore[assignment]
        self.driver.server = types.SimpleNamespace(port=4242, close=lambda: None)  # type: ignore[assignment]
        self.driver.registry.update(self.driver.backend.find())

    def _start(self, host: str, argv: Sequence[str], env: Mapping[str, str], **kwargs: Any) -> FakeGroup:
        return FakeGroup(host, argv, env, **kwargs)

    # --- the test's hands -----------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        self.now += seconds

    def tick(self, times: int = 1) -> Phase:
        for _ in range(times):
            phase = self.driver.tick()
            self.advance(supervision.TICK)
        return phase

    def group(self, wid: str) -> FakeGroup:
        group = self.driver.workers[wid].group
        assert isinstance(group, FakeGroup)
        return group

    def join(self, *wids: str) -> None:
        """The workers reached hvd.init() of the current generation (and the store before that)."""
        for wid in wids:
            self.store.set(rdzv.alive_key(wid), "1")
            self.store.set(rdzv.joined_key(self.driver.generation, wid), "1")

    def leave(self, *wids: str) -> None:
        """The workers left the current generation (hvd.elastic.run after an error or a host update)."""
        for wid in wids:
            self.store.set(rdzv.left_key(self.driver.generation, wid), "1")
            self.store.add(rdzv.left_count_key(self.driver.generation), 1)

    def exit(self, wid: str, code: int) -> None:
        self.group(wid).code = code

    def update(self, hosts: dict[str, int]) -> None:
        """What the discovery thread does when the hosts change."""
        self.driver.registry.update(hosts)


def formed(job: Job, capsys: pytest.CaptureFixture[str], line: str) -> str:
    """Tick until ``line`` appears in the driver's output; the output."""
    out = ""
    for _ in range(5):
        job.tick()
        out += capsys.readouterr().err
        if line in out:
            return out
    raise AssertionError(f"{line!r} not in {out!r}")


# --- the first generation --------------------------------------------------------------------------
def test_the_first_generation_waits_for_np_slots_then_starts_one_worker_a_slot(monkeypatch, capsys):
    job = Job(monkeypatch, [("localhost", 1)])
    assert job.tick(3) is Phase.WAITING_FOR_HOSTS
    assert not job.driver.workers
    job.update({"localhost": 1, "127.0.0.1": 1})  # a second host turns up
    assert job.tick() is Phase.RUNNING
    err = capsys.readouterr().err
    assert ("ringtrain elastic: generation 1: 2 worker(s) on localhost[0],127.0.0.1[0]; started w1, w2\n"
            in err)
    assignment = rdzv.Assignment.from_json(job.store.keys[rdzv.assignment_key(1)])
    assert job.store.keys[rdzv.CURRENT] == "1"
    assert [(w, s.hostname, s.rank, s.size) for w, s in assignment.workers.items()] == [
        ("w1", "localhost", 0, 2), ("w2", "127.0.0.1", 1, 2)]
    env = job.group("w2").env
    assert (env["HOROVOD_RANK"], env[rdzv.ENV_WORKER], env[rdzv.ENV_GENERATION]) == ("1", "w2", "1")
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242"
    assert env[ENV_SECRET] == job.driver.secret  # a local worker: in its environment
    assert "RANK" not in env  # an enclosing launcher's variables stay out
    assert env["OMP_NUM_THREADS"] == "1"  # both workers share this machine


def test_too_few_slots_for_the_elastic_timeout_end_the_job_before_it_starts(monkeypatch, capsys):
    job = Job(monkeypatch, [("localhost", 1)], timeout=3.0)
    job.driver.waiting.since = job.now  # type: ignore[union-attr]
    job.advance(3.0)
    assert job.tick() is Phase.WAITING_FOR_HOSTS
    job.advance(0.5)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 1
    err = capsys.readouterr().err
    assert ("ringtrain elastic: the job stops: only 1 slot(s) usable, fewer than the 2 needed (-np 2), for "
            "--elastic-timeout 3 s (usable hosts: localhost:1; hosts from -H/--hostfile). HINT: add hosts or "
            "slots, lower --min-np, or raise --elastic-timeout.\n") in err
    assert "Root cause" not in err
    assert "generation 1" not in err


# --- a worker fails: re-formed, its host blacklisted, back after the cooldown --------------------------
def test_a_killed_worker_is_replaced_its_host_blacklisted_then_back_after_its_cooldown(monkeypatch, capsys):
    # tests/elastic/test_elastic_launch.py::test_sigkilled_worker_is_replaced_... as decisions
    job = Job(monkeypatch, cooldown=(1, 2))
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    assert job.tick(2) is Phase.RUNNING
    job.exit("w2", -signal.SIGKILL)
    assert job.tick() is Phase.BREAKING
    assert job.store.keys[rdzv.abort_key(1)] == "worker w2 failed"
    job.leave("w1")  # its allreduce failed: hvd.elastic.run restores and re-initializes
    assert job.tick() is Phase.RE_FORMING
    err = capsys.readouterr().err
    assert "ringtrain elastic: worker w2 (rank 1 on 127.0.0.1) failed: killed by SIGKILL\n" in err
    assert ("ringtrain elastic: generation 1 broke: 1 worker(s) failed, 1 wait to go on; re-forming the "
            "group (reset 1)\n") in err
    err = formed(job, capsys, "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w3")
    assert rdzv.Assignment.from_json(job.store.keys[rdzv.assignment_key(2)]).workers["w1"].rank == 0
    job.join("w1", "w3")
    job.tick()
    job.exit("w3", -signal.SIGKILL)  # the replacement on the same host fails too
    job.tick()
    job.leave("w1")
    err = formed(job, capsys, "generation 3: 1 worker(s) on localhost[0]\n")  # on without the host
    assert "host 127.0.0.1 is blacklisted after repeated failures (usable hosts: localhost:1; blacklisted: " \
           "127.0.0.1 for another" in err
    job.join("w1")
    job.tick(2)
    capsys.readouterr()
    job.advance(3.0)  # the cooldown (1 to 2 s) ends
    assert job.tick() is Phase.RUNNING
    err = capsys.readouterr().err
    assert "ringtrain elastic: host 127.0.0.1 is back from the blacklist (its cooldown ended)\n" in err
    assert ("ringtrain elastic: hosts changed (new slots 127.0.0.1[0]): the workers re-form at their next "
            "state.commit()\n") in err
    assert '"result": 2' in job.store.keys[rdzv.update_key(1)]
    job.tick(3)
    assert rdzv.update_key(2) not in job.store.keys  # published once
    job.leave("w1")  # rank 0 saw the update at its commit
    err = formed(job, capsys, "generation 4: 2 worker(s) on localhost[0],127.0.0.1[0]; started w4")
    assert ("generation 3 ends: its 1 worker(s) re-form the group for the changed hosts (reset 3)" in err)
    assert rdzv.Assignment.from_json(job.store.keys[rdzv.assignment_key(4)]).updates == 1
    job.join("w1", "w4")
    job.exit("w1", 0)
    job.exit("w4", 0)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 0
    assert "ringtrain elastic: job finished after 3 re-formation(s) of the group (4 generations)\n" in \
        capsys.readouterr().err


def test_a_host_failing_twice_is_blacklisted_and_min_np_ends_the_job_after_the_timeout(monkeypatch, capsys):
    # was a process test of tests/elastic/test_elastic_launch.py, every assertion of it here; its last one
    # (no worker left after the job gave up) is kept there by test_reset_limit_ends_the_job_at_the_next_break
    job = Job(monkeypatch, min_np=2, timeout=3.0)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.exit("w2", -signal.SIGKILL)
    job.tick()
    job.leave("w1")
    formed(job, capsys, "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w3")
    job.join("w1", "w3")
    job.exit("w3", -signal.SIGKILL)
    job.tick()
    job.leave("w1")
    assert job.tick() is Phase.RE_FORMING
    assert job.tick(10) is Phase.RE_FORMING  # 1 slot usable, --min-np 2: waits
    job.advance(3.0)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 1
    err = capsys.readouterr().err
    assert "host 127.0.0.1 is blacklisted after repeated failures" in err
    stop = next(line for line in err.splitlines() if "the job stops:" in line)
    assert "only 1 slot(s) usable, fewer than the 2 needed (--min-np 2), for --elastic-timeout 3 s" in stop
    assert "blacklisted: 127.0.0.1 for good" in stop
    assert "HINT:" in stop
    assert "Root cause" in err
    assert "killed by SIGKILL" in err
    assert "generation 3" not in err


def test_the_reset_limit_ends_the_job_at_the_next_break(monkeypatch, capsys):
    # tests/elastic/test_elastic_launch.py::test_reset_limit_ends_the_job_at_the_next_break as decisions
    job = Job(monkeypatch, reset_limit=0)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.exit("w2", -signal.SIGKILL)
    job.tick()
    job.leave("w1")
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 1
    err = capsys.readouterr().err
    assert ("ringtrain elastic: the job stops: the group broke again after --reset-limit 0 re-formation(s). "
            "HINT: raise --reset-limit, or look at the root cause below.\n") in err
    assert "rank       : 1" in err  # the root cause: the killed worker
    assert "generation 2" not in err


def test_the_reset_limit_counts_every_re_formation(monkeypatch, capsys):
    job = Job(monkeypatch, reset_limit=1)
    formed(job, capsys, "generation 1:")
    job.exit("w2", 1)
    job.tick()
    job.leave("w1")
    err = formed(job, capsys, "generation 2:")
    assert "re-forming the group (reset 1 of at most 1)" in err
    job.exit("w3", 1)
    job.tick()
    job.leave("w1")
    assert job.tick() is Phase.DONE
    assert "after --reset-limit 1 re-formation(s)" in capsys.readouterr().err


# --- hosts changed by discovery --------------------------------------------------------------------
def test_a_host_added_by_discovery_joins_at_the_next_commit(monkeypatch, capsys):
    # tests/elastic/test_elastic_launch.py::test_a_host_added_by_discovery_joins_at_the_next_commit
    job = Job(monkeypatch, [("localhost", 1)], num_proc=1, min_np=1, max_np=2)
    formed(job, capsys, "generation 1: 1 worker(s) on localhost[0]; started w1\n")
    job.join("w1")
    job.tick(2)
    assert rdzv.update_key(1) not in job.store.keys
    job.update({"localhost": 1, "127.0.0.1": 1})
    job.tick()
    err = capsys.readouterr().err
    assert ("ringtrain elastic: hosts changed (new slots 127.0.0.1[0]): the workers re-form at their next "
            "state.commit()\n") in err
    assert '"result": 2' in job.store.keys[rdzv.update_key(1)]
    job.leave("w1")
    err = formed(job, capsys, "generation 2: 2 worker(s) on localhost[0],127.0.0.1[0]; started w2")
    assert "generation 1 ends: its 1 worker(s) re-form the group for the changed hosts (reset 1)" in err
    assert "failed:" not in err
    assert job.store.keys[rdzv.abort_key(1)] == "worker w1 left generation 1"
    assert job.group("w2").env["HOROVOD_SIZE"] == "2"


def test_a_host_dropped_by_discovery_leaves_at_the_next_commit(monkeypatch, capsys):
    # tests/elastic/test_elastic_launch.py::test_a_host_dropped_by_discovery_leaves_at_the_next_commit
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.tick()
    job.update({"localhost": 1})
    job.tick()
    err = capsys.readouterr().err
    assert ("ringtrain elastic: hosts changed (slots gone 127.0.0.1[0]): the workers re-form at their next "
            "state.commit()\n") in err
    assert '"result": 1' in job.store.keys[rdzv.update_key(1)]
    job.leave("w1", "w2")
    err = formed(job, capsys, "generation 2: 1 worker(s) on localhost[0]\n")
    assert "generation 1 ends: its 2 worker(s) re-form the group for the changed hosts (reset 1)" in err
    job.exit("w2", 0)  # "has no place in generation 2": not a failure
    job.join("w1")
    job.tick(2)
    job.exit("w1", 0)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 0
    err += capsys.readouterr().err
    assert "failed:" not in err
    assert "job finished after 1 re-formation(s) of the group (2 generations)" in err


def test_a_host_change_that_leaves_fewer_than_min_np_slots_tells_every_slot_gone(monkeypatch, capsys):
    job = Job(monkeypatch, min_np=2)
    formed(job, capsys, "generation 1:")
    job.tick()
    job.update({"localhost": 1})
    job.tick(3)
    assert '"result": 1' in job.store.keys[rdzv.update_key(1)]
    assert rdzv.update_key(2) not in job.store.keys
    assert ("hosts changed (slots gone 127.0.0.1[0],localhost[0]): the workers re-form at their next "
            "state.commit()") in capsys.readouterr().err


# --- giving up -------------------------------------------------------------------------------------
def test_every_worker_failed_leaves_no_state_to_go_on_from(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.exit("w1", -signal.SIGKILL)
    job.exit("w2", 7)
    assert job.tick() is Phase.RE_FORMING
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 1
    err = capsys.readouterr().err
    assert "generation 1 broke: 2 worker(s) failed, 0 wait to go on; re-forming the group (reset 1)" in err
    assert "ringtrain elastic: the job stops: every worker failed, so no state is left to go on from\n" in err
    assert "Root cause" in err


def test_no_survivor_placed_in_the_next_generation_ends_the_job(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.exit("w1", -signal.SIGKILL)  # rank 0 fails; the survivor w2 sits on a host that then goes
    job.tick()
    job.update({"localhost": 1})
    job.leave("w2")
    assert job.tick() is Phase.RE_FORMING
    assert job.tick() is Phase.DONE
    err = capsys.readouterr().err
    assert ("the job stops: no surviving worker has a slot in the next generation, so nobody holds the "
            "committed state to broadcast (usable hosts: localhost:1). HINT: raise --max-np, or keep the "
            "hosts of the running workers in the discovery output.") in err


def test_a_survivor_that_dies_while_waiting_is_a_failure_and_no_longer_a_survivor(monkeypatch, capsys):
    job = Job(monkeypatch, min_np=2)
    formed(job, capsys, "generation 1:")
    job.exit("w2", 1)
    job.tick()
    job.update({"localhost": 1})  # too few slots: the survivor waits
    job.leave("w1")
    assert job.tick(3) is Phase.RE_FORMING
    job.exit("w1", -signal.SIGKILL)
    assert job.tick() is Phase.DONE  # reaped, then no survivor left in the same tick
    err = capsys.readouterr().err
    assert "worker w1 (rank -1 on localhost) failed: killed by SIGKILL" in err
    assert "worker w1 (rank 0 on localhost) failed" not in err  # one failure, told once
    assert [f.rank for f in job.driver.failures] == [1, -1]
    assert "the job stops: every worker failed, so no state is left to go on from" in err


def test_a_member_that_never_leaves_a_broken_generation_is_killed_after_the_elastic_timeout(
        monkeypatch, capsys):
    job = Job(monkeypatch, timeout=3.0)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.exit("w2", 1)
    assert job.tick() is Phase.BREAKING
    assert job.tick(10) is Phase.BREAKING
    assert job.group("w1").code is None
    job.advance(3.0)
    job.tick()
    assert job.group("w1").code == -signal.SIGKILL
    err = capsys.readouterr().err
    assert ("ringtrain elastic: worker w1 did not leave generation 1 within --elastic-timeout 3 s after it "
            "broke; killing it\n") in err
    assert job.tick() is Phase.RE_FORMING  # its exit reaped: every member has exited
    assert "worker w1 (rank 0 on localhost) failed: killed by SIGKILL" in capsys.readouterr().err


def test_a_member_that_never_reaches_init_is_killed_after_start_plus_elastic_timeout(monkeypatch, capsys):
    job = Job(monkeypatch, timeout=3.0)
    formed(job, capsys, "generation 1:")
    job.join("w1")
    job.advance(32.5)  # --start-timeout 30 + --elastic-timeout 3 after its formation, nearly
    job.tick()
    assert job.group("w2").code is None
    job.advance(0.5)
    job.tick()
    assert job.group("w2").code == -signal.SIGKILL
    assert job.group("w1").code is None
    assert ("ringtrain elastic: worker w2 did not reach hvd.init() within --start-timeout + "
            "--elastic-timeout (30 + 3 s) of generation 1; killing it\n") in capsys.readouterr().err
    assert job.tick() is Phase.BREAKING  # its exit is a failure like any other


# --- the end of a job ------------------------------------------------------------------------------
def test_the_job_ends_0_once_every_member_exited_0(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.exit("w1", 0)
    assert job.tick(3) is Phase.FINISHING
    job.exit("w2", 0)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 0
    assert "re-formation" not in capsys.readouterr().err  # none happened: nothing said


def test_a_member_failing_after_another_finished_ends_the_job_1_with_its_report(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.exit("w1", 0)
    job.exit("w2", 7)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 1
    err = capsys.readouterr().err
    assert "worker w2 (rank 1 on 127.0.0.1) failed: exit code 7" in err
    assert "the job stops:" not in err
    assert "Root cause" in err


def test_a_worker_finishing_while_others_wait_to_re_form_tells_them_to_stop(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.leave("w2")
    assert job.tick() is Phase.BREAKING
    assert job.store.keys[rdzv.abort_key(1)] == "worker w2 left generation 1"
    job.exit("w1", 0)
    assert job.tick() is Phase.FINISHING
    assert job.store.keys[rdzv.STOP] == "a worker finished the job while others waited to re-form"
    job.exit("w2", 0)
    assert job.tick() is Phase.DONE
    assert job.driver.exit_code == 0


def test_a_stop_signal_ends_the_loop_with_128_plus_it_and_stops_every_worker(monkeypatch, capsys):
    job: Job

    def sleep(seconds: float) -> None:
        job.advance(seconds)
        if job.driver.phase is Phase.RUNNING:
            job.driver.signals.on_signal(signal.SIGTERM)

    job = Job(monkeypatch, sleep=sleep)
    assert job.driver._loop() == 128 + signal.SIGTERM
    assert job.driver.phase is Phase.DONE
    err = capsys.readouterr().err
    assert "ringtrain elastic: stopped by SIGTERM; every worker was stopped.\n" in err
    job.driver._stop_workers()  # what run() does after the loop
    assert job.store.keys[rdzv.STOP] == "the driver is ending the job"
    assert job.group("w1").stopped
    assert job.group("w2").stopped


# --- how a worker failed ---------------------------------------------------------------------------
def test_a_worker_that_cannot_reach_the_job_store_blacklists_its_host_at_once(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.exit("w2", UNREACHABLE_EXIT)  # no alive key: it never reached the store
    job.tick()
    err = capsys.readouterr().err
    assert ("ringtrain elastic: worker w2 (rank 1 on 127.0.0.1) failed: it could not reach the job store "
            "from its host\n") in err
    assert "ringtrain elastic: host 127.0.0.1 is blacklisted: no worker can start there\n" in err
    assert job.driver.registry.is_blacklisted("127.0.0.1")


def test_a_remote_worker_gets_the_secret_on_stdin_and_one_ssh_cannot_start_blacklists_its_host(
        monkeypatch, capsys):
    job = Job(monkeypatch, [("localhost", 1), ("hostB", 1)], verbose=True)
    formed(job, capsys, "generation 1:")
    remote = job.group("w2")
    assert ENV_SECRET not in remote.env
    assert remote.env[ENV_SECRET_ON_STDIN] == "1"
    assert remote.proc.stdin.getvalue() == job.driver.secret.encode() + b"\n"
    assert remote.env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.9"  # the address that routes there
    remote.tail = ["ssh: connect to host hostB port 22: Connection refused\n"]
    remote.not_started = True
    remote.code = 255
    job.tick()
    err = capsys.readouterr().err
    assert ("worker w2 (rank 1 on hostB) failed: ssh could not start it (ssh: connect to host hostB port 22: "
            "Connection refused)\n") in err
    assert "host hostB is blacklisted: no worker can start there" in err


def test_a_remote_host_whose_ssh_lost_contact_counts_one_failure(monkeypatch, capsys):
    job = Job(monkeypatch, [("localhost", 1), ("hostB", 1)])
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    remote = job.group("w2")
    remote.not_started = remote.lost = True
    remote.code = 255
    job.tick()
    err = capsys.readouterr().err
    assert "worker w2 (rank 1 on hostB) failed: worker w2 ended with its place (hostB)\n" in err
    assert "blacklisted" not in err
    assert job.driver.registry.state("hostB").failures == 1


def test_a_silent_worker_is_killed_as_lost_and_its_failure_says_so(monkeypatch, capsys):
    job = Job(monkeypatch)
    formed(job, capsys, "generation 1:")
    job.join("w1", "w2")
    job.group("w2").goes_silent = True
    assert job.tick() is Phase.BREAKING  # killed, reaped and the generation broken in one tick
    assert job.group("w2").code == -signal.SIGKILL
    err = capsys.readouterr().err
    assert ("worker w2 (rank 1 on 127.0.0.1) failed: lost contact with host 127.0.0.1: no word from the "
            f"worker for {job.driver.silence_limit:.0f} s (RINGTRAIN_PEER_TIMEOUT_SECONDS): the host is down "
            "or the network to it is cut\n") in err
    assert job.driver.failures[0].state == "unreachable"


def test_two_failures_on_one_host_in_one_generation_count_once(monkeypatch, capsys):
    job = Job(monkeypatch, [("localhost", 1), ("127.0.0.1", 2)], num_proc=3, max_np=3)
    formed(job, capsys, "generation 1:")
    job.exit("w2", 1)
    job.exit("w3", 1)
    job.tick()
    assert job.driver.registry.state("127.0.0.1").failures == 1
    assert "blacklisted" not in capsys.readouterr().err


# --- --ray: the Ray-specific parts -----------------------------------------------------------------
def test_on_ray_workers_start_in_actors_and_a_lost_node_leaves_the_hosts_at_once(monkeypatch, capsys):
    ray = FakeRayHosts({"10.0.0.1": 1, "10.0.0.2": 1})
    job = Job(monkeypatch, [], ray=ray, verbose=True)
    assert job.driver.backend is ray
    peer_timeout = float(elastic_driver.read_knob("peer_timeout_s", {}))
    assert job.driver.pulse.interval == link.sparse_beat_interval(peer_timeout)  # beats as sparse as may be
    err = formed(job, capsys, "generation 1: 2 worker(s) on 10.0.0.1[0],10.0.0.2[0]; started w1, w2")
    assert ray.started == [("10.0.0.1", 0), ("10.0.0.2", 1)]
    assert f"worker w1 on Ray node 10.0.0.1: agent pid {job.group('w1').pid}" in err
    env = job.group("w2").env
    assert ENV_SECRET not in env
    assert env[ENV_SECRET_ON_STDIN] == "1"
    assert env[link.ENV_BEAT_INTERVAL] == f"{job.driver.pulse.interval:g}"
    job.join("w1", "w2")
    ray.nodes.pop("10.0.0.2")  # the Ray discovery leaves out a node whose actor was lost
    job.group("w2").lost = True
    job.exit("w2", -signal.SIGKILL)
    job.tick()
    assert job.driver.registry.available() == [("10.0.0.1", 1)]  # before the discovery thread's round
    job.leave("w1")
    err = formed(job, capsys, "generation 2: 1 worker(s) on 10.0.0.1[0]\n")
    assert "worker w2 (rank 1 on 10.0.0.2) failed: worker w2 ended with its place (10.0.0.2)" in err


def test_on_ray_an_actor_that_did_not_start_is_told_by_its_group(monkeypatch, capsys):
    ray = FakeRayHosts({"10.0.0.1": 1, "10.0.0.2": 1})
    job = Job(monkeypatch, [], ray=ray)
    formed(job, capsys, "generation 1:")
    group = job.group("w2")
    group.not_started = True
    group.code = 1
    job.tick()
    err = capsys.readouterr().err
    assert "worker w2 (rank 1 on 10.0.0.2) failed: worker w2 ended with its place (10.0.0.2)\n" in err
    assert "host 10.0.0.2 is blacklisted: no worker can start there" in err


def test_a_discovery_that_fails_before_the_first_generation_is_a_usage_error():
    ray = FakeRayHosts({})

    def broken() -> dict[str, int]:
        raise DiscoveryError("the Ray cluster did not answer ray.nodes(): ConnectionError: gone")

    ray.find = broken  # type: ignore[method-assign]
    driver = ElasticDriver(LaunchConfig(command=("python", "train.py"), num_proc=1, min_np=1), {},
                           backend=ray)
    with pytest.raises(UsageError, match=r"did not answer ray.nodes\(\): ConnectionError: gone"):
        driver.run()  # before any job store or worker
