"""Fault injection across two hosts: a link cut for good or for a moment, a lossy slow link, a hung or
killed rank, a killed agent. The job must end non-zero within the documented bound with a message
naming the host (or ride the fault out), and leave no process of ours on either host.

The launcher runs on hostA; rank 1 lives on hostB. Bounds are checked with a wide margin (the machine
may be loaded): what is tested is that the job ends by itself long before the kernel's TCP timeout
(about 16 minutes), not how fast; docs/failures.md has the times measured.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.netns import NamespaceHosts
from tests.integration.system import (
    ROOT,
    SHARED_DATA,
    clean_env,
    ringtrain_argv,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLE = ROOT / "examples" / "mnist_cnn_multihost.py"
#: The job of every fault but the lossy link's: allreduces of the CNN's gradient size, no CNN to compute.
FAULT_JOB = Path(__file__).resolve().with_name("fault_job.py")
MNIST = SHARED_DATA / "mnist"
#: RINGTRAIN_PEER_TIMEOUT_SECONDS of these jobs: smaller than the default (20 s) to keep the suite short;
#: RINGTRAIN_TEST_PEER_TIMEOUT=20 measures the default (``-s`` prints how long each job took to end).
PEER_TIMEOUT = float(os.environ.get("RINGTRAIN_TEST_PEER_TIMEOUT", "8"))
#: The documented bound for the launcher to end after a fault: the peer timeout plus the agents'
#: shutdown grace (docs/failures.md); a job gets twice that on a loaded machine.
LAUNCHER_BOUND = PEER_TIMEOUT + 30


@pytest.fixture
def hosts(netns_hosts: NamespaceHosts) -> Iterator[NamespaceHosts]:
    """The namespace hosts, once ringtrain can launch and reduce across them; the link is restored after."""
    if not (MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"real MNIST not found under {MNIST} (the shared data folder beside the repo)")
    yield netns_hosts
    netns_hosts.set_link(True)
    for host in netns_hosts.hosts:
        for pid in our_processes(netns_hosts, host):
            os.kill(pid, signal.SIGKILL)


def our_processes(hosts: NamespaceHosts, host: str) -> list[int]:
    """Launchers, agents and ranks of ours living on ``host`` (sshd's own processes are not ours)."""
    found = []
    for pid in hosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        ours = "ringtrain" in cmdline or EXAMPLE.name in cmdline or FAULT_JOB.name in cmdline
        if state != "Z" and ours and "lossy_link" not in cmdline:
            found.append(pid)
    return found


def rank_pid(hosts: NamespaceHosts, host: str, rank: int) -> int | None:
    """The training process of ``rank`` on ``host`` (not the ssh session or the agent above it)."""
    found = {}
    for pid in hosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if any(FAULT_JOB.name.encode() in part for part in cmdline) and f"RANK={rank}".encode() in environ:
            found[pid] = ppid
    leaves = [pid for pid in found if pid not in found.values()]
    return leaves[0] if len(leaves) == 1 else None


def agent_pid(hosts: NamespaceHosts, host: str) -> int | None:
    """The agent (``ringtrain.launch.node_entry``) of ``host``."""
    for pid in hosts.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if b"ringtrain.launch.node_entry" in cmdline:
            return pid
    return None


#: A plain torch.distributed job (no ringtrain engine): only the launcher can bound its failures.
DDP_LOOP = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
step = 0
while True:
    dist.all_reduce(torch.ones(10_000))
    step += 1
    if step % 4 == 0 and dist.get_rank() == 0:
        print(f"ddp step {step} done", flush=True)
    time.sleep(0.05)
"""


class Job:
    """``ringtrain run -np 2 -H hostA:1,hostB:1`` started on hostA, of ``command``, else of the fault job
    (``fault_job.py``: allreduces until the fault ends it, or ``steps`` held after ``hold_at`` until the
    test releases them), else, with ``epochs``, of the multi-host MNIST example."""

    def __init__(self, hosts: NamespaceHosts, tmp_path: Path, *extra: str, epochs: int | None = None,
                 samples: int = 1024, steps: int = 0, hold_at: int | None = None,
                 env: dict[str, str] | None = None, command: tuple[str, ...] | None = None) -> None:
        self.log = tmp_path / "launcher.log"
        self.folder = tmp_path
        if command is None and epochs is not None:
            command = (sys.executable, str(EXAMPLE), "--data-dir", str(MNIST), "--train-samples",
                       str(samples), "--test-samples", "200", "--lr", "0.05", "--log-every", "4", "--epochs",
                       str(epochs))
        elif command is None:
            command = (sys.executable, str(FAULT_JOB), str(tmp_path), "--steps", str(steps),
                       *(("--hold-at", str(hold_at)) if hold_at is not None else ()))
        argv = ringtrain_argv("run", "-np", "2", "-H", "hostA:1,hostB:1", "-i", str(hosts.key),
                              "--start-timeout", "120", *extra, *command)
        variables = {"RINGTRAIN_PEER_TIMEOUT_SECONDS": f"{PEER_TIMEOUT:g}", **(env or {})}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(hosts.command("hostA", argv), stdout=out, stderr=subprocess.STDOUT,
                                         env=clean_env(variables), cwd=ROOT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_training(self, needle: str = "step 4 ") -> None:
        wait_for(lambda: needle in self.output() or self.proc.poll() is not None, 300,
                 "training to start on both hosts", logs=[self.log])
        assert self.proc.poll() is None, self.output()

    def release(self) -> None:
        """Let a job held at its gate (``hold_at``) go on to its last step."""
        (self.folder / "release").touch()

    def wait(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds it took; not ending within ``timeout`` fails the test (the bound, with
        room for a loaded machine)."""
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the launcher did not end within {timeout:g} s of the fault\n{self.output()}")
        seconds = time.monotonic() - start
        print(f"the launcher ended {seconds:.1f} s after the fault (exit code {code})")
        return code, seconds

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def assert_no_process_left(hosts: NamespaceHosts, timeout: float = 120) -> None:
    """Every process of ours ends on both hosts by itself (nothing kills them here)."""
    deadline = time.monotonic() + timeout
    left: dict[str, list[int]] = {}
    while time.monotonic() < deadline:
        left = {host: pids for host in hosts.hosts if (pids := our_processes(hosts, host))}
        if not left:
            return
        time.sleep(0.5)
    details = {host: [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in pids]
               for host, pids in left.items()}
    pytest.fail(f"processes left after the job ended: {details}")


def test_link_cut_for_good_ends_the_job_naming_the_unreachable_host(hosts, tmp_path):
    job = Job(hosts, tmp_path)
    try:
        job.wait_training()
        far_agent = agent_pid(hosts, "hostB")
        hosts.set_link(False)
        code, seconds = job.wait(timeout=2 * LAUNCHER_BOUND)
    finally:
        job.kill()
    output = job.output()
    assert code != 0, output
    said = ("rank 1 on host hostB has given no sign of life", "lost contact with host hostB")
    assert any(words in output for words in said), output
    # hostB's side ends by itself too, across the cut: its ranks lose rank 0, its agent the launcher
    assert_no_process_left(hosts)
    # what hostB's agent said could not cross the cut: its host keeps it (launch/link.py, note_on_host)
    log = Path(tempfile.gettempdir()) / f"ringtrain-agents-{os.getuid()}.log"
    noted = log.read_text() if log.exists() else ""
    assert f"host hostB pid {far_agent}: no word from the launcher" in noted, noted[-2000:]


def test_link_cut_for_good_ends_a_plain_ddp_job_too(hosts, tmp_path):
    # No engine, no heartbeats between the ranks: the launcher's ssh probes and the agents' watch of
    # the launcher's beats bound it (a rank blocked in gloo would wait 30 minutes).
    job = Job(hosts, tmp_path, command=(sys.executable, "-c", DDP_LOOP))
    try:
        job.wait_training()
        hosts.set_link(False)
        code, seconds = job.wait(timeout=2 * LAUNCHER_BOUND)
    finally:
        job.kill()
    output = job.output()
    assert code != 0, output
    assert "lost contact with host hostB" in output, output
    assert_no_process_left(hosts)


#: The short cuts' job: SHORT_CUT_STEPS steps, held after SHORT_CUT_HOLD (allreduces still crossing the
#: link) until the test has cut the link and restored it. Held, it cannot finish before the cut however
#: loaded the machine (CI once finished a 3-epoch MNIST job between the test seeing step 4 and the cut).
SHORT_CUT_STEPS = 16
SHORT_CUT_HOLD = 8


def cut_while_training(job: Job, hosts: NamespaceHosts, seconds: float) -> None:
    """Cut the link for ``seconds``, restore it, and release the held job; a job that had already finished
    when the link went down fails the test (it would show nothing about the cut)."""
    hosts.set_link(False)
    assert "final: " not in job.output(), f"the job ended before the cut; lengthen it\n{job.output()}"
    time.sleep(seconds)
    hosts.set_link(True)
    job.release()


def test_short_cut_is_ridden_out(hosts, tmp_path):
    # 5 s without a link is well inside RINGTRAIN_PEER_TIMEOUT_SECONDS: TCP retransmits, nothing fails.
    job = Job(hosts, tmp_path, steps=SHORT_CUT_STEPS, hold_at=SHORT_CUT_HOLD,
              env={"RINGTRAIN_PEER_TIMEOUT_SECONDS": "20"})
    try:
        job.wait_training(f"holding at step {SHORT_CUT_HOLD}")
        cut_while_training(job, hosts, seconds=5)
        code, _ = job.wait(timeout=600)
    finally:
        job.kill()
    output = job.output()
    assert code == 0, output
    assert f"final: {SHORT_CUT_STEPS} steps on 2 ranks" in output, output


def test_short_cut_with_restarts_enabled_recovers(hosts, tmp_path):
    # A cut longer than the peer timeout fails the attempt; --max-restarts starts a new one that finishes.
    job = Job(hosts, tmp_path, "--max-restarts", "3", steps=SHORT_CUT_STEPS, hold_at=SHORT_CUT_HOLD,
              env={"RINGTRAIN_PEER_TIMEOUT_SECONDS": "2"})
    try:
        job.wait_training(f"holding at step {SHORT_CUT_HOLD}")
        cut_while_training(job, hosts, seconds=5)
        code, _ = job.wait(timeout=300)
    finally:
        job.kill()
    output = job.output()
    assert code == 0, output
    assert "restarting every rank (attempt 1" in output, output  # the cut did fail the first attempt
    assert f"final: {SHORT_CUT_STEPS} steps on 2 ranks" in output, output  # the new attempt ran them all


def test_lossy_slow_link_is_ridden_out(hosts, tmp_path):
    # 5 % loss and 10 ms each way (tests.integration.lossy_link: this kernel has no netem)
    with hosts.impaired(loss=0.05, delay_ms=10):
        # the MNIST example itself: its 8 steps of CNN gradients over the impaired link (docs/failures.md)
        job = Job(hosts, tmp_path, epochs=1, samples=512, env={"RINGTRAIN_PEER_TIMEOUT_SECONDS": "20"})
        try:
            code, _ = job.wait(timeout=600)
        finally:
            job.kill()
    output = job.output()
    assert code == 0, output
    assert "final: 8 steps on 2 ranks" in output, output


def test_hung_remote_rank_ends_the_job_naming_it(hosts, tmp_path):
    job = Job(hosts, tmp_path)
    pid = None
    try:
        job.wait_training()
        pid = rank_pid(hosts, "hostB", 1)
        assert pid is not None, f"rank 1's process not found on hostB\n{job.output()}"
        os.kill(pid, signal.SIGSTOP)  # alive for its kernel, silent for everyone else
        code, seconds = job.wait(timeout=2 * LAUNCHER_BOUND)
    finally:
        job.kill()
    output = job.output()
    assert code != 0, output
    assert "rank 1 on host hostB has given no sign of life" in output, output
    # a stopped process takes SIGTERM only when it runs again: its agent kills it after its grace
    assert_no_process_left(hosts)


def test_killed_remote_agent_ends_the_job_naming_its_host(hosts, tmp_path):
    job = Job(hosts, tmp_path)
    try:
        job.wait_training()
        pid = agent_pid(hosts, "hostB")
        assert pid is not None, f"no agent found on hostB\n{job.output()}"
        os.kill(pid, signal.SIGKILL)
        code, seconds = job.wait(timeout=2 * LAUNCHER_BOUND)
    finally:
        job.kill()
    output = job.output()
    assert code != 0, output
    report = output.split("Root cause", 1)[-1]
    assert "hostB" in report, output
    assert_no_process_left(hosts)  # its ranks died with it (PR_SET_PDEATHSIG)
    # Its folder stayed behind (a SIGKILL runs no clean-up); the next agent started on hostB removes it.
    stale = list(Path(tempfile.gettempdir()).glob(f"ringtrain-run-hostB-{pid}-*"))
    assert stale, "the killed agent's folder was not where the next agent looks"
    result = hosts.run("hostB", [sys.executable, "-c", "import shutil; from ringtrain.launch.agent import "
                                 "run_folder; shutil.rmtree(run_folder())"], timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert not any(folder.exists() for folder in stale)


def test_random_rank_killed_at_a_random_time_is_the_root_cause(hosts, tmp_path):
    rank = random.randrange(2)
    host = ("hostA", "hostB")[rank]
    job = Job(hosts, tmp_path)
    try:
        job.wait_training()
        time.sleep(random.uniform(0, 3))
        pid = rank_pid(hosts, host, rank)
        assert pid is not None, f"rank {rank}'s process not found on {host}\n{job.output()}"
        os.kill(pid, signal.SIGKILL)
        code, seconds = job.wait(timeout=2 * LAUNCHER_BOUND)
    finally:
        job.kill()
    output = job.output()
    assert code != 0, output
    report = output.split("Root cause", 1)[-1]
    assert f"host       : {host}" in report, output
    assert f"rank       : {rank} of 2" in report, output
    assert "SIGKILL" in report, output
    assert_no_process_left(hosts)


#: Ranks that ignore every stop signal (as ones stuck in a C call do), each saying when it is ready.
STUBBORN = ("import os, signal, time\n"
            "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "print('stubborn rank', os.environ['RANK'], 'ready', flush=True)\n"
            "while True:\n"
            "    time.sleep(1)\n")


def press_ctrl_c_twice(job: Job) -> int:
    """Once both stubborn ranks are ready: Ctrl-C, and again once the launcher announced the stop;
    the launcher's exit code, which must come well inside the 30 s the ranks would otherwise get."""
    try:
        wait_for(lambda: job.output().count("ready") == 2 or job.proc.poll() is not None, 300,
                 "both ranks to start", logs=[job.log])
        assert job.proc.poll() is None, job.output()
        job.proc.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping the ranks on every host" in job.output() or job.proc.poll() is not None,
                 30, "the launcher to announce the stop", logs=[job.log])
        time.sleep(1.5)  # a second press, not the first delivered twice
        assert job.proc.poll() is None, job.output()  # the ranks ignore the first: they have 30 s
        job.proc.send_signal(signal.SIGINT)
        code, _ = job.wait(timeout=20)  # well inside the 30 s the ranks would otherwise get
    finally:
        job.kill()
    return code


def test_a_second_ctrl_c_kills_the_ranks_on_every_host_at_once(hosts, tmp_path):
    job = Job(hosts, tmp_path, command=(sys.executable, "-c", STUBBORN))
    code = press_ctrl_c_twice(job)
    output = job.output()
    assert code == 128 + signal.SIGINT, output
    assert "SIGINT again: killing the ranks on every host now." in output
    assert_no_process_left(hosts, timeout=20)  # hostB's rank too, across ssh


#: Ranks that answer a scheduler's warning as the Trainer does: they say so and exit 75 (preempted).
WARNED = ("import os, signal, socket, sys, time\n"
          "def warned(signum, frame):\n"
          "    name = signal.Signals(signum).name\n"
          "    print(f'rank {os.environ[\"RANK\"]} on {socket.gethostname()} got {name}', flush=True)\n"
          "    sys.exit(75)\n"
          "signal.signal(signal.SIGUSR1, warned)\n"
          "signal.signal(signal.SIGTERM, warned)\n"
          "print('warned rank', os.environ['RANK'], 'ready', flush=True)\n"
          "while True:\n"
          "    time.sleep(1)\n")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["USR1", "TERM"])
def test_sigusr1_to_the_launcher_reaches_the_rank_on_the_far_host_and_the_job_exits_75(hosts, tmp_path, sig):
    # Slurm's --signal=USR1@120 (or LSF's bsub -wa USR1) reaches the launcher; the ranks must hear it.
    # A scheduler's SIGTERM (preemption, PBS's walltime) stops the ranks with their grace: ranks that
    # snapshot and exit 75 on it make the job preempted too, not "stopped by SIGTERM".
    job = Job(hosts, tmp_path, command=(sys.executable, "-c", WARNED))
    try:
        wait_for(lambda: job.output().count("ready") == 2 or job.proc.poll() is not None, 300,
                 "both ranks to start", logs=[job.log])
        assert job.proc.poll() is None, job.output()
        job.proc.send_signal(sig)
        code, _ = job.wait(timeout=60)
    finally:
        job.kill()
    output = job.output()
    assert code == 75, output
    assert f"rank 1 on hostB got {sig.name}" in output, output  # across ssh, to the far host's rank
    assert f"rank 0 on hostA got {sig.name}" in output, output
    assert "stopped on request with exit status 75" in output, output
    assert "Root cause" not in output, output
    assert_no_process_left(hosts, timeout=20)
