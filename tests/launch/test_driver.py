"""The driver: the hop to each node's agent (``python -m ringtrain.launch.node_entry CONFIG_JSON``), what
a driven agent does (failure markers, stop on EOF), the srun re-launch, and the checks before any rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ringtrain.launch.driver as driver
from ringtrain.exceptions import UsageError
from ringtrain.launch import link, store_host
from ringtrain.launch.config import DriverLink, LaunchConfig
from ringtrain.launch.entry import launch
from ringtrain.launch.hosts import HostSlots
from ringtrain.launch.plan import SrunPlan
from ringtrain.launch.report import RankFailure
from ringtrain.launch.stopping import REPEAT_AFTER_S
from tests.processes import alive
from tests.ranks import free_port

REPORT_ENV = str(Path(__file__).resolve().parent / "scripts" / "report_env.py")


def read_ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


def wait_until(condition, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


# --- the hop: a node's config as one JSON argument -------------------------------------------------

USER = LaunchConfig(command=("python", "train.py"), num_proc=3, hosts=(HostSlots("a", 2), HostSlots("b", 1)),
                    master_addr="a", master_port=4000, output_filename="out", verbose=True,
                    tuning={"HOROVOD_CYCLE_TIME": "2"}, notes=("--mpi accepted",), max_restarts=1)


def test_node_config_is_one_node_of_a_static_rendezvous():
    node = driver.node_config(USER, 1, 2, 1, "a:4000", "run-1", [2, 1], ["a", "b"])
    assert (node.node_rank, node.nnodes, node.nproc_per_node) == (1, (2, 2), 1)
    assert (node.rdzv_backend, node.rdzv_endpoint, node.rdzv_id) == ("static", "a:4000", "run-1")
    assert node.driver == DriverLink((2, 1), ("a", "b"))
    assert node.output_filename == os.path.abspath("out")  # the agent may start elsewhere
    assert node.hosts is None  # an agent starts its own ranks, it does not drive hosts
    assert node.num_proc is None
    assert node.master_addr is None
    assert node.notes == ()  # the driver warned once already
    # what the user asked for travels unchanged
    assert (node.command, node.tuning, node.verbose, node.max_restarts) == (
        USER.command, USER.tuning, True, 1)


def test_one_node_uses_the_master_address_given_but_standalone_ignores_it():
    port = free_port()
    assert driver.local_endpoint(LaunchConfig(command=("true",), master_port=port)) == f"127.0.0.1:{port}"
    # a Trainer v2 pod's PET_MASTER_ADDR/PORT name node 0's pod: `--standalone` is this pod alone
    pod = LaunchConfig(command=("true",), standalone=True, master_addr="mnist-node-0-0.mnist",
                       master_port=port)
    host, _, chosen = driver.local_endpoint(pod).rpartition(":")
    assert host == "127.0.0.1"
    assert chosen.isdigit()
    assert int(chosen) != port


def test_node_argv_carries_the_config_as_one_argument():
    node = driver.node_config(USER, 0, 2, 2, "a:4000", "run-1", [2, 1], ["a", "b"])
    argv = driver.node_argv(node, python="/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "ringtrain.launch.node_entry"]
    assert len(argv) == 4
    assert LaunchConfig.from_json(argv[3]) == node


def driven_config(tmp_path: Path, *mode: str) -> LaunchConfig:
    """What a driver hands the agent of node 0 of a one-node job on this machine (ranks report in ranks/)."""
    (tmp_path / "ranks").mkdir()
    config = LaunchConfig(command=(sys.executable, REPORT_ENV, str(tmp_path / "ranks"), *mode),
                          tuning={"HOROVOD_CYCLE_TIME": "7"}, start_timeout=20)
    return driver.node_config(config, 0, 1, 2, f"127.0.0.1:{free_port()}", "test-run", [2], ["nodeA"])


#: The secret the tests' driver hands its agents on stdin.
SECRET = "d" * 64


class Agent:
    """A driven agent as a driver holds it: its stdin open (EOF means stop), its output in files.

    Like a driver, it first writes the job's secret on the agent's stdin (``secret=None``: nothing).
    """

    def __init__(self, config: LaunchConfig, folder: Path, secret: str | None = SECRET) -> None:
        self.out, self.err = folder / "agent.out", folder / "agent.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(driver.node_argv(config), stdin=subprocess.PIPE, stdout=out,
                                         stderr=err)
        if secret is not None:
            # as a driver does: the job's secret first (the agent waits up to a minute for that line)
            store_host.send_secret(self.proc.stdin, secret)

    def wait(self, timeout: float = 240) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        return code, self.out.read_text(), self.err.read_text()

    def rank_pids(self, folder: Path) -> list[int]:
        """The pids of the node's 2 ranks, once both reported (in ``folder``) while the agent runs."""
        assert wait_until(lambda: len(read_ranks(folder)) == 2 or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.err.read_text()
        return [env["pid"] for env in read_ranks(folder).values()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdin.close()


@pytest.mark.slow
def test_an_agent_runs_its_node_from_the_json_alone(tmp_path):
    config = driven_config(tmp_path)
    code, out, err = Agent(config, tmp_path).wait()
    assert code == 0, err
    ranks = read_ranks(tmp_path / "ranks")
    assert sorted(ranks) == [0, 1]
    for rank, env in ranks.items():
        assert env["HOROVOD_RANK"] == str(rank)
        assert env["HOROVOD_HOSTNAME"] == "nodeA"  # from the driver's node hosts
        assert (env["HOROVOD_CROSS_RANK"], env["HOROVOD_CROSS_SIZE"]) == ("0", "1")
        assert env["HOROVOD_CYCLE_TIME"] == "7"  # the config's tuning reached the workers
        # the secret came over stdin, not on the agent's command line; the job store is node 0's
        # (this agent's own, on the rendezvous endpoint)
        assert env["RINGTRAIN_JOB_SECRET"] == SECRET
        assert env["RINGTRAIN_JOB_STORE"] == config.rdzv_endpoint
        assert SECRET not in " ".join(env["argv"])
    assert "[1] hello from rank 1" in out


@pytest.mark.slow
def test_a_driven_agent_without_the_handover_starts_no_rank(tmp_path):
    agent = Agent(driven_config(tmp_path), tmp_path, secret=None)
    agent.proc.stdin.close()  # the driver went away before handing anything over
    code, _, err = agent.wait()
    assert code == 1
    assert "the driver went away before handing over the job's secret" in err
    assert read_ranks(tmp_path / "ranks") == {}


@pytest.mark.slow
def test_a_driven_agent_reports_a_failure_as_a_marker_for_its_driver(tmp_path):
    code, _, err = Agent(driven_config(tmp_path, "fail"), tmp_path).wait()
    assert code == 1
    markers = [f for f in map(RankFailure.from_marker, err.splitlines()) if f is not None]
    assert len(markers) == 1, err
    assert (markers[0].rank, markers[0].host) == (1, "nodeA")
    assert "ValueError: rank one gives up" in markers[0].message
    assert "Root cause" not in err  # the driver prints the one report


@pytest.mark.slow
def test_a_driven_agent_stops_its_ranks_when_its_stdin_closes(tmp_path):
    agent = Agent(driven_config(tmp_path, "sleep"), tmp_path)
    try:
        pids = agent.rank_pids(tmp_path / "ranks")
        agent.proc.stdin.close()  # the driver went away
        assert agent.proc.wait(timeout=90) == 128 + signal.SIGTERM
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=30)
    finally:
        agent.stop()


@pytest.mark.slow
def test_a_driven_agent_stops_on_a_stop_request_and_kills_its_ranks_on_a_kill_request(tmp_path):
    agent = Agent(driven_config(tmp_path, "stubborn"), tmp_path)
    try:
        pids = agent.rank_pids(tmp_path / "ranks")
        agent.proc.stdin.write(link.STOP_REQUEST + b"\n")
        agent.proc.stdin.flush()
        # The ranks ignore the stop: the agent gives them its grace, stdin still open.
        with pytest.raises(subprocess.TimeoutExpired):
            agent.proc.wait(timeout=3)
        assert all(alive(pid) for pid in pids)
        agent.proc.stdin.write(link.KILL_REQUEST + b"\n")
        agent.proc.stdin.flush()
        # Well inside the 30 s the ranks would otherwise get.
        assert agent.proc.wait(timeout=20) == 128 + signal.SIGTERM
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10)
    finally:
        agent.stop()


@pytest.mark.slow
def test_a_second_ctrl_c_at_a_multi_host_driver_kills_every_hosts_ranks(tmp_path):
    (tmp_path / "ranks").mkdir()
    hosts = "localhost:1,127.0.0.1:1"  # two nodes, each with an agent the driver starts
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli.main", "run", "-H", hosts,
                             sys.executable, REPORT_ENV, str(tmp_path / "ranks"), "stubborn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_until(lambda: len(read_ranks(tmp_path / "ranks")) == 2 or proc.poll() is not None)
        assert proc.poll() is None
        pids = [env["pid"] for env in read_ranks(tmp_path / "ranks").values()]
        proc.send_signal(signal.SIGINT)
        time.sleep(REPEAT_AFTER_S + 0.5)  # a second press, not the first delivered twice
        assert proc.poll() is None
        assert all(alive(pid) for pid in pids)  # the ranks ignore the first
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 128 + signal.SIGINT
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10)
        err = proc.stderr.read().decode()
        assert "SIGINT: stopping the ranks on every host (they get 30 s; press Ctrl-C again" in err
        assert "SIGINT again: killing the ranks on every host now." in err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


#: A rank that answers SIGUSR1 as the Trainer does: it notes it (a file named for its rank) and exits 75.
WARNED = ("import os, signal, sys, time\n"
          "def warned(signum, frame):\n"
          "    open(os.path.join(sys.argv[1], 'rank' + os.environ['RANK']), 'w').write(str(signum))\n"
          "    sys.exit(75)\n"
          "signal.signal(signal.SIGUSR1, warned)\n"
          "open(os.path.join(sys.argv[1], 'ready' + os.environ['RANK']), 'w').close()\n"
          "time.sleep(600)\n")


@pytest.mark.slow
def test_sigusr1_to_the_launcher_reaches_every_rank_and_the_job_exits_75(tmp_path):
    # One node: the agent passes it on to its ranks. The driver's way (-H, over each agent's link) is
    # tests/integration/test_failures.py's, across ssh, which covers the local agent's link as well.
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain.cli.main", "run", "-np", "2", sys.executable,
                             "-c", WARNED, str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        assert wait_until(lambda: len(list(tmp_path.glob("ready*"))) == 2 or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGUSR1)
        code = proc.wait(timeout=60)
        err = proc.stderr.read().decode()
        assert code == 75, err
        assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"], err
        assert all(p.read_text() == str(int(signal.SIGUSR1)) for p in tmp_path.glob("rank*"))
        assert "stopped on request with exit status 75" in err
        assert "Root cause" not in err  # a requested stop is no failure
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_a_driven_agent_stops_its_ranks_when_the_driver_falls_silent(tmp_path, monkeypatch):
    # The driver beats on the agent's stdin; a link cut leaves the pipe open but silent.
    monkeypatch.setenv("RINGTRAIN_PEER_TIMEOUT_SECONDS", "2")
    agent = Agent(driven_config(tmp_path, "sleep"), tmp_path)

    def started() -> bool:
        agent.proc.stdin.write(b"\n")  # the driver's beat, until the ranks run; then silence
        agent.proc.stdin.flush()
        return len(read_ranks(tmp_path / "ranks")) == 2 or agent.proc.poll() is not None

    try:
        assert wait_until(started)
        assert agent.proc.poll() is None, agent.err.read_text()
        pids = [env["pid"] for env in read_ranks(tmp_path / "ranks").values()]
        assert agent.proc.wait(timeout=120) == 128 + signal.SIGTERM  # stdin still open, only silent
        assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=30)
        assert "no word from the launcher for 2 s (RINGTRAIN_PEER_TIMEOUT_SECONDS)" in agent.err.read_text()
    finally:
        agent.stop()


@pytest.mark.slow
def test_an_agent_whose_driver_never_beats_judges_only_eof(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGTRAIN_PEER_TIMEOUT_SECONDS", "1")
    code, _, err = Agent(driven_config(tmp_path), tmp_path).wait()
    assert code == 0, err


def test_bad_worker_settings_are_a_usage_error_naming_the_flag_value():
    config = LaunchConfig(command=("python", "-c", "pass"), num_proc=2, tuning={"HOROVOD_CYCLE_TIME": "-1"})
    with pytest.raises(UsageError, match=r"HOROVOD_CYCLE_TIME='-1' is out of range: it is in milliseconds"):
        driver.check_worker_settings(config, {})
    # interface names are the workers' to judge: their hosts may have others than this one
    driver.check_worker_settings(LaunchConfig(command=("x",), network_interfaces=("ib9",)), {})


# --- the srun re-launch ---------------------------------------------------------------------------

def fake_srun(folder: Path) -> Path:
    """An ``srun`` that records its arguments and exits 3, on a PATH of its own."""
    srun = folder / "srun"
    record = folder / "argv.json"
    srun.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\nsys.exit(3)\n")
    srun.chmod(0o755)
    return folder


def test_relaunch_with_srun_hands_each_task_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_srun(tmp_path)) + os.pathsep + os.environ["PATH"])
    config = LaunchConfig(command=("python", "train.py"), num_proc=8, output_filename="logs",
                          tuning={"HOROVOD_CYCLE_TIME": "2"}, notes=("--mpi accepted",))
    assert driver.relaunch_with_srun(config, SrunPlan(nnodes=2, nproc_per_node=4)) == 3  # srun's code
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:4] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert argv[4:7] == [sys.executable, "-m", "ringtrain.launch.node_entry"]
    task = LaunchConfig.from_json(argv[7])
    assert task.nproc_per_node == 4
    assert task.output_filename == os.path.abspath("logs")
    assert (task.command, task.tuning, task.notes) == (config.command, config.tuning, ())
    assert task.driver is None  # each task is an agent of its own, reporting for itself


def test_relaunch_with_srun_passes_sigusr1_on_to_srun(tmp_path, monkeypatch):
    # srun passes the signals it gets on to its tasks (the node agents); ours must reach srun first. This
    # srun signals its parent (this process, the launcher) once its handler is in place.
    srun = tmp_path / "srun"
    srun.write_text(f"#!{sys.executable}\nimport os, signal, sys, time\n"
                    "def got(signum, frame):\n"
                    f"    open({str(tmp_path / 'got')!r}, 'w').write(signal.Signals(signum).name)\n"
                    "    sys.exit(75)\n"
                    "signal.signal(signal.SIGUSR1, got)\n"
                    "os.kill(os.getppid(), signal.SIGUSR1)\n"
                    "time.sleep(60)\n"
                    "sys.exit(1)\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    before = signal.getsignal(signal.SIGUSR1)
    assert driver.relaunch_with_srun(LaunchConfig(command=("x",)), SrunPlan(nnodes=2, nproc_per_node=1)) == 75
    assert (tmp_path / "got").read_text() == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) == before


def test_relaunch_without_srun_is_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="srun is not on PATH. HINT:"):
        driver.relaunch_with_srun(LaunchConfig(command=("x",)), SrunPlan(nnodes=2, nproc_per_node=1))


# --- before any rank starts -----------------------------------------------------------------------

@pytest.mark.parametrize(("command", "needle"), [
    (("ringtrain-no-such-command-xyz",), "command not found"),
    (("python", "no_such_script_xyz.py"), "script not found"),
    (("no_such_script_xyz.py", "--lr", "1"), "script not found"),
])
def test_check_command_refuses_what_cannot_start(command, needle):
    with pytest.raises(UsageError, match=needle):
        driver.check_command(command)


@pytest.mark.parametrize("command", [("python", "-c", "pass"), ("python", "-m", "json.tool"), ("true",),
                                     (sys.executable, REPORT_ENV)])
def test_check_command_accepts_what_can_start(command):
    driver.check_command(command)


def test_check_build_prints_what_this_installation_has(capsys):
    assert launch(LaunchConfig(command=(), check_build=True), environ={}) == 0
    out = capsys.readouterr().out
    assert "Available Frameworks:" in out
    assert "[X] PyTorch" in out
    assert "[X] Gloo" in out


def test_notes_are_printed_once_and_verbose_shows_the_table(tmp_path, capsys):
    config = LaunchConfig(command=(sys.executable, REPORT_ENV, str(tmp_path)), num_proc=1, verbose=True,
                          notes=("--mpi accepted: ranks communicate through torch.distributed",))
    assert launch(config) == 0
    err = capsys.readouterr().err
    assert err.count("ringtrain run: warning: --mpi accepted") == 1
    assert "ringtrain run: resolved configuration" in err
    assert "ringtrain run: plan NodePlan(" in err
