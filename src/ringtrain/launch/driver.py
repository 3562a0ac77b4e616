"""``launch(config)``: start the ranks the plan asks for, wait, and report the first failure once.

One node here: the elastic agent runs in this process. Several hosts: this process is a driver that
starts one agent per host (``python -m ringtrain.launch.node_entry CONFIG_JSON``; directly for this
machine, over ssh for the others), relays their output, stops all of them as soon as one fails, and
prints the earliest failure of all hosts as the root cause. Inside a Slurm batch script spanning
several nodes, ``srun`` starts one such agent per node instead.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ringtrain import __version__
from ringtrain.engine.auth import ENV_SECRET
from ringtrain.engine.settings import check_environ, read_knob
from ringtrain.exceptions import SettingError, UsageError
from ringtrain.launch import store_host
from ringtrain.launch.agent import NodeSpec, run_node
from ringtrain.launch.config import DriverLink, LaunchConfig, exported_values, worker_environment
from ringtrain.launch.hosts import assign_slots, is_local_host, is_loopback_name, nodes_of
from ringtrain.launch.plan import HostsPlan, NodePlan, SrunPlan, check_port_free, free_port, resolve_plan
from ringtrain.launch.remote import cwd_for_remote, forwarded_environment, probe_hosts, remote_command
from ringtrain.launch.report import RankFailure, earliest, format_report
from ringtrain.launch.stopping import REPEAT_AFTER_S, kill_process_groups, killing_line, stopping_line
from ringtrain.launch.worker_entry import is_python

#: Seconds an agent gets to stop its ranks after SIGTERM before it is killed.
SHUTDOWN_GRACE = 30.0
#: Most seconds between two heartbeats a driver writes to each agent's stdin (and back, on stderr).
BEAT_INTERVAL = 1.0
#: The line a driven agent writes on stderr every second: the driver hears that its host is there.
ALIVE_LINE = "@@RINGTRAIN_ALIVE@@"
#: Requests a driver writes on an agent's stdin, each on a line of its own (an empty line is a
#: heartbeat): stop the ranks as on SIGTERM, or kill them at once (a second Ctrl-C at the driver).
#: End-of-file means "stop" too: the driver is gone.
STOP_REQUEST, KILL_REQUEST = b"stop", b"kill"


def check_command(command: Sequence[str], no_python: bool = False) -> None:
    """Refuse a command that cannot start, before any rank is spawned."""
    program = command[0]
    script = None
    if no_python:
        if shutil.which(program) is None:
            raise UsageError(f"--no-python: {program!r} is not an executable on PATH or a path to an "
                             "executable file. HINT: give an executable (chmod +x it, with a #! line), or "
                             "drop --no-python to run a .py file through Python.")
    elif is_python(program):
        rest = list(command[1:])
        if rest and not rest[0].startswith("-"):
            script = rest[0]
    elif program.endswith(".py"):
        script = program
    elif shutil.which(program) is None:
        raise UsageError(f"command not found: {program!r}. HINT: give a program on PATH, a path to an "
                         "executable, or a Python script (python train.py / train.py).")
    if script is not None and not os.path.isfile(script):
        raise UsageError(f"script not found: {script!r} (in {os.getcwd()}). HINT: check the path of the "
                         "Python script to run.")


def check_log_dir(path: str) -> None:
    """``--log-dir`` must be a folder this process can create and write (on every node it runs on)."""
    try:
        os.makedirs(path, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except OSError as exc:
        raise UsageError(f"--log-dir {path!r} cannot be created: {exc.strerror}. HINT: give a folder path "
                         "that this user may create, e.g. --log-dir ./logs.") from None
    if not writable:
        raise UsageError(f"--log-dir {path!r} is not writable. HINT: pick a folder of your own, e.g. "
                         "--log-dir ./logs.")


def check_build() -> str:
    """horovodrun --check-build's summary for this installation."""
    import torch.distributed as dist

    def box(flag: bool) -> str:
        return "[X]" if flag else "[ ]"

    nccl = dist.is_available() and dist.is_nccl_available()
    return "\n".join([
        f"ringtrain v{__version__} (torch {__import__('torch').__version__}):", "",
        "Available Frameworks:", f"    {box(False)} TensorFlow", f"    {box(True)} PyTorch",
        f"    {box(False)} MXNet",
        "", "Available Controllers:", f"    {box(False)} MPI", f"    {box(dist.is_gloo_available())} Gloo",
        "", "Available Tensor Operations:", f"    {box(nccl)} NCCL", f"    {box(False)} DDL",
        f"    {box(False)} CCL",
        f"    {box(False)} MPI", f"    {box(dist.is_gloo_available())} Gloo",
    ])


def launch(config: LaunchConfig, environ: Mapping[str, str] | None = None) -> int:
    """Run ``config.command`` as the configured ranks; returns the launcher's exit code."""
    environ = dict(os.environ if environ is None else environ)
    if config.check_build:
        print(check_build())
        return 0
    for note in config.notes:
        print(f"ringtrain run: warning: {note}", file=sys.stderr)
    if config.verbose:
        print("ringtrain run: resolved configuration\n" + config.table(), file=sys.stderr)
    exported_values(config, environ)  # a bare -x NAME that is not set here fails before anything starts
    if config.log_dir:
        check_log_dir(config.log_dir)
    check_worker_settings(config, environ)
    if config.elastic:
        from ringtrain.launch.elastic_driver import launch_elastic

        check_command(config.command, config.no_python)
        return launch_elastic(config, environ)
    plan = resolve_plan(config, environ)
    if config.verbose:
        print(f"ringtrain run: plan {plan}", file=sys.stderr)
    if isinstance(plan, SrunPlan):
        return relaunch_with_srun(config, plan)
    if isinstance(plan, HostsPlan):
        return _launch_hosts(config, plan, environ)
    return _launch_node(config, plan, environ)


def check_worker_settings(config: LaunchConfig, environ: Mapping[str, str]) -> None:
    """Refuse a ``HOROVOD_*`` / ``RINGTRAIN_*`` value the workers would refuse, before any rank starts.

    The rules are the workers' own (``ringtrain.engine.settings``). Interface names are left to the
    workers: the hosts that run them may have other interfaces than this one.
    """
    try:
        check_environ({**environ, **config.worker_env}, skip=("GLOO_SOCKET_IFNAME",))
    except SettingError as exc:
        problem, _, hint = str(exc).partition(" HINT: ")
        raise UsageError(f"{problem} Every rank would refuse it, so none was started. HINT: {hint}") from None


def _launch_node(config: LaunchConfig, plan: NodePlan, environ: Mapping[str, str],
                 node_hosts: tuple[str, ...] | None = None) -> int:
    check_command(config.command, config.no_python)
    endpoint = plan.rdzv_endpoint
    if plan.local_only:
        if config.master_port:
            check_port_free(config.master_port)
        endpoint = f"{config.master_addr or '127.0.0.1'}:{config.master_port or free_port()}"
    elif plan.node_rank == 0 and plan.rdzv_backend == "static" and is_local_host(endpoint.rpartition(":")[0]):
        check_port_free(int(endpoint.rpartition(":")[2]))
    driven = config.driver is not None
    hosts = config.driver.node_hosts if config.driver is not None else node_hosts
    # A driver's agent finds the job's secret on the first line of its stdin (see store_host).
    try:
        secret = store_host.read_secret() if driven else None
    except EOFError:
        print("ringtrain run: error: the driver went away before handing over the job's secret; no rank "
              "was started", file=sys.stderr)
        return 1
    spec = NodeSpec(
        nproc=plan.nproc, node_rank=plan.node_rank, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
        rdzv_backend=plan.rdzv_backend, rdzv_endpoint=endpoint, run_id=plan.run_id,
        rdzv_timeout=max(config.start_timeout, 1.0) * 4, max_restarts=config.max_restarts,
        host=hosts[plan.node_rank] if hosts and plan.node_rank < len(hosts) else None,
        output_dir=config.output_filename,
        env=worker_environment(config, environ, plan.nproc, plan.local_only, node_hosts),
        failure_marker=driven, verbose=config.verbose, log_dir=_absolute(config.log_dir),
        redirects=config.redirects, tee=config.tee, local_addr=config.local_addr, rdzv_conf=config.rdzv_conf,
        secret=secret, layout=config.driver.node_slots if config.driver is not None else None,
    )
    watcher = None
    if driven:
        peer_timeout = read_knob("peer_timeout_s", environ)
        watcher = _watch_stdin(contact_timeout(peer_timeout, config.max_restarts),
                               spec.host or socket.gethostname())
        _beat_to_driver(min(BEAT_INTERVAL, peer_timeout / 4))
    try:
        return run_node(spec, list(config.command))
    finally:
        del watcher


def contact_timeout(peer_timeout: float, max_restarts: int) -> float:
    """Seconds of silence after which the driver and its agents give each other up.

    Without restarts a silent host ends the job after ``RINGTRAIN_PEER_TIMEOUT_SECONDS``. With
    ``--max-restarts`` the ranks still notice a cut link after that time and fail, but the launchers
    stay as patient as the rendezvous is with a missing node, so a short cut costs one restart, not the
    job.
    """
    if max_restarts <= 0:
        return peer_timeout
    from ringtrain.launch.rendezvous import NODE_TIMEOUT

    return max(peer_timeout, NODE_TIMEOUT)


def _beat_to_driver(interval: float) -> threading.Thread:
    """Write :data:`ALIVE_LINE` on stderr every ``interval`` s: the driver's sign that this host is
    reachable (it reports a host it has not heard from for RINGTRAIN_PEER_TIMEOUT_SECONDS as lost)."""
    def beat() -> None:
        with contextlib.suppress(OSError, ValueError):
            while True:
                sys.stderr.write(ALIVE_LINE + "\n")
                sys.stderr.flush()
                time.sleep(interval)

    thread = threading.Thread(target=beat, name="ringtrain-alive", daemon=True)
    thread.start()
    return thread


def _watch_stdin(silence_s: float, host: str) -> threading.Thread:
    """A driver's agents stop when the driver asks or goes away, and kill their ranks when it asks.

    :data:`STOP_REQUEST` or end-of-file on stdin means SIGTERM to ourselves (torch's agent then stops
    its ranks); :data:`KILL_REQUEST` means SIGKILL to every rank's process group at once.

    The driver also writes a heartbeat line every second: once one has arrived, ``silence_s``
    (``RINGTRAIN_PEER_TIMEOUT_SECONDS``) without another means the driver's host is unreachable or
    the link to it is cut (ssh would notice only at the kernel's TCP timeout, minutes later), and
    this host's ranks are stopped too. An agent whose driver never beats judges only EOF; one that was
    asked to stop hears no more beats and keeps listening for a kill request.

    The agent's main thread can sit in a blocking store call (the exit barrier after its ranks
    finished, or a rendezvous) where Python signal handlers do not run; once none of our worker
    processes is left, exiting at once is safe, so the watcher does that.
    """
    def watch() -> None:
        heard, last, stopping, partial = False, time.monotonic(), False, b""
        # os.read on the raw descriptor: a daemon thread blocked in sys.stdin would hold its lock at exit.
        with contextlib.suppress(OSError, ValueError):
            while True:
                ready, _, _ = select.select([0], [], [], 1.0)
                if ready:
                    data = os.read(0, 4096)
                    if not data:
                        break
                    heard, last = True, time.monotonic()
                    *lines, partial = (partial + data).split(b"\n")
                    if KILL_REQUEST in lines:
                        kill_process_groups(live_children(os.getpid()))
                        break
                    if STOP_REQUEST in lines and not stopping:
                        stopping = True
                        os.kill(os.getpid(), signal.SIGTERM)
                elif heard and not stopping and time.monotonic() - last > silence_s:
                    print(f"ringtrain run: host {host}: no word from the launcher for {silence_s:g} s "
                          "(RINGTRAIN_PEER_TIMEOUT_SECONDS): its host is unreachable or the network to it "
                          "is cut; stopping the ranks of this host.", file=sys.stderr, flush=True)
                    break
        if not stopping:
            os.kill(os.getpid(), signal.SIGTERM)
        while True:
            time.sleep(1.0)
            children = live_children(os.getpid())
            if not children:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(128 + signal.SIGTERM)
            # A stopped rank (SIGSTOP, a debugger) takes the agent's SIGTERM only once it runs again;
            # without this it would be killed only after the agent's 30 s grace.
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    thread = threading.Thread(target=watch, name="ringtrain-stdin-watch", daemon=True)
    thread.start()
    return thread


def live_children(pid: int) -> list[int]:
    """Pids of the living (not zombie) children of ``pid``, read from /proc; [] where there is none."""
    children = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fp:
                fields = fp.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.append(int(entry))
    return children


def node_config(config: LaunchConfig, node_rank: int, nnodes: int, nproc: int, endpoint: str, run_id: str,
                slots: Sequence[int], hosts: Sequence[str]) -> LaunchConfig:
    """The config of one host's agent, started by a driver: this node's part of a static rendezvous."""
    return replace(config, num_proc=None, hosts=None, nnodes=(nnodes, nnodes), nproc_per_node=nproc,
                   node_rank=node_rank, rdzv_backend="static", rdzv_endpoint=endpoint, rdzv_id=run_id,
                   master_addr=None, master_port=None, output_filename=_absolute(config.output_filename),
                   log_dir=_absolute(config.log_dir), check_build=False, notes=(),
                   driver=DriverLink(tuple(slots), tuple(hosts)))


def node_argv(config: LaunchConfig, python: str = sys.executable) -> list[str]:
    """The command line that runs ``config`` as an agent (started by a driver, ssh or srun)."""
    return [python, "-m", "ringtrain.launch.node_entry", config.to_json()]


def _absolute(path: str | None) -> str | None:
    # an agent may start in another folder (srun tasks, remote hosts): give it the full path
    return os.path.abspath(path) if path else None


def relaunch_with_srun(config: LaunchConfig, plan: SrunPlan) -> int:
    """Inside a batch script spanning nodes: one ``srun`` task per node, each the agent of its node.

    Each task gets ``config`` (with the plan's ranks per node) as JSON; it finds its node rank and
    node 0's address in srun's variables. Returns srun's exit code.
    """
    if shutil.which("srun") is None:
        raise UsageError(f"this Slurm job has {plan.nnodes} nodes but srun is not on PATH. HINT: load the "
                         "Slurm module, or start the job step yourself: "
                         "srun --ntasks-per-node=1 ringtrain run ...")
    task = replace(config, nproc_per_node=plan.nproc_per_node,
                   output_filename=_absolute(config.output_filename), log_dir=_absolute(config.log_dir),
                   check_build=False, notes=())
    srun = ["srun", f"--nodes={plan.nnodes}", f"--ntasks={plan.nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", *node_argv(task)]
    if config.verbose:
        print("ringtrain run: inside a Slurm batch job, re-launching through: " + " ".join(srun),
              file=sys.stderr)
    # srun hands its environment to every task: the secret reaches each node's agent there, not in argv.
    env = dict(os.environ)
    env[ENV_SECRET] = store_host.node_secret(env, whole_job_here=True) or ""
    proc = subprocess.Popen(srun, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


class _Node:
    """One agent process of a multi-host job and the threads relaying its output."""

    def __init__(self, index: int, host: str, argv: list[str], env: dict[str, str] | None, remote: bool,
                 failures: list[RankFailure], lock: threading.Lock) -> None:
        self.index, self.host, self.remote = index, host, remote
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.failures, self.lock = failures, lock
        self.errors: list[str] = []
        #: When this agent was seen to end with an error before the driver asked anything of it.
        self.ended_early: float | None = None
        #: When its last sign of life arrived (None until the first: an agent that never beats is not
        #: judged), and whether the driver gave up on hearing from it.
        self.heard: float | None = None
        self.silent_for: float | None = None
        self._stopping = False
        with contextlib.suppress(OSError, AttributeError):
            os.set_blocking(self.proc.stdin.fileno(), False)  # type: ignore[union-attr]
        self.threads = [threading.Thread(target=self._relay, args=(self.proc.stdout, sys.stdout, False),
                                         daemon=True),
                        threading.Thread(target=self._relay, args=(self.proc.stderr, sys.stderr, True),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _relay(self, stream: object, dest: object, is_err: bool) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = raw.decode(errors="replace")
            if is_err and line.rstrip("\n") == ALIVE_LINE:
                self.heard = time.monotonic()
                continue
            failure = RankFailure.from_marker(line.rstrip("\n")) if is_err else None
            with self.lock:
                if failure is not None:
                    self.failures.append(failure)
                    continue
                if is_err:
                    self.errors = (self.errors + [line])[-20:]
                dest.write(line)  # type: ignore[attr-defined]
                dest.flush()  # type: ignore[attr-defined]

    def beat(self) -> None:
        """One heartbeat line on the agent's stdin: the agent stops its ranks when they stop coming."""
        if self._stopping:
            return
        # A full pipe (an agent or an ssh that does not read) skips a beat rather than block the driver.
        with contextlib.suppress(OSError, ValueError):
            os.write(self.proc.stdin.fileno(), b"\n")  # type: ignore[union-attr]

    def lost(self) -> RankFailure:
        """The root-cause record of an agent that ended with an error and no report of its ranks."""
        tail = [line.strip() for line in self.errors if line.strip()]
        last = tail[-1] if tail else ""
        code = self.proc.returncode
        if self.silent_for is not None:
            message = (f"lost contact with host {self.host}: no word from its agent for "
                       f"{self.silent_for:.0f} s (RINGTRAIN_PEER_TIMEOUT_SECONDS, with --max-restarts at "
                       "least the rendezvous' node timeout): the host is down or the network to it is cut")
        elif self.remote and code == 255 and ("not responding" in last or "timed out" in last.lower()):
            message = (f"lost contact with host {self.host}: ssh: {last} (the host is down or the network "
                       "to it is cut)")
        elif self.remote and code == 255:
            message = (f"the agent on host {self.host} ended without a report (ssh exit code 255: it was "
                       f"killed, or its ssh session broke{': ' + last if last else ''})")
        elif code is not None and code < 0:
            message = f"the agent of node {self.index} on host {self.host} was killed by " \
                      f"{signal.Signals(-code).name}"
        else:
            how = "ssh" if self.remote else "local"
            message = f"the agent of node {self.index} ({how}) ended without a report"
        return RankFailure(host=self.host, rank=-1, local_rank=-1, exitcode=code if code is not None else -1,
                           pid=self.proc.pid, time=self.ended_early or time.time(),
                           output_tail="".join(self.errors), message=message,
                           state="unreachable" if self.silent_for is not None else "")

    def check_silence(self, limit: float) -> bool:
        """True (once) when the agent, heard before, has said nothing for ``limit`` s: its host is lost."""
        if self.heard is None or self.silent_for is not None or self.proc.poll() is not None:
            return False
        silent = time.monotonic() - self.heard
        if silent <= limit:
            return False
        self.silent_for = silent
        self.ended_early = time.time()
        return True

    def stop(self) -> None:
        """Ask the agent to stop its ranks: a stop request on its stdin (also over ssh), which stays
        open for a kill request, or EOF where the request cannot be written; SIGTERM when local."""
        self._stopping = True
        if not self._request(STOP_REQUEST):
            self._close_stdin()
        if not self.remote and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def kill_ranks(self) -> None:
        """Ask the agent to kill its ranks now (a second Ctrl-C), then close its stdin."""
        self._stopping = True
        self._request(KILL_REQUEST)
        self._close_stdin()

    def _request(self, request: bytes) -> bool:
        try:
            return os.write(self.proc.stdin.fileno(), request + b"\n") == len(request) + 1  # type: ignore[union-attr]
        except (OSError, ValueError):  # a full pipe, an agent gone, stdin already closed
            return False

    def _close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # type: ignore[union-attr]

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)


def _launch_hosts(config: LaunchConfig, plan: HostsPlan, environ: Mapping[str, str]) -> int:
    assignments = assign_slots(plan.hosts, plan.num_proc)
    nodes = nodes_of(assignments)
    local = [is_local_host(n.host) for n in nodes]
    if len(nodes) == 1 and local[0]:
        node = NodePlan(nproc=nodes[0].slots, node_rank=0, min_nodes=1, max_nodes=1, rdzv_backend="static",
                        rdzv_endpoint="", run_id=config.rdzv_id or "ringtrain", local_only=True,
                        source=plan.source)
        return _launch_node(config, node, environ, node_hosts=(nodes[0].host,))
    if any(local):
        check_command(config.command, config.no_python)
    remote_hosts = [n.host for n, is_local in zip(nodes, local) if not is_local]
    probe_hosts(remote_hosts, config.ssh_port, config.ssh_identity_file, config.start_timeout)
    first = nodes[0].host
    addr = config.master_addr or first
    if local[0] and is_loopback_name(addr) and not all(local):
        addr = socket.getfqdn()
    if config.master_port:
        port = config.master_port
        if local[0]:
            check_port_free(port)
    else:
        port = free_port() if local[0] else 29400 + os.getpid() % 1000
    endpoint = f"{addr}:{port}"
    run_id = config.rdzv_id or uuid.uuid4().hex[:12]
    peer_timeout = float(read_knob("peer_timeout_s", environ))
    silence_limit = contact_timeout(peer_timeout, config.max_restarts)
    secret = store_host.node_secret(environ, whole_job_here=True)
    slots = [n.slots for n in nodes]
    hosts = [n.host for n in nodes]
    failures: list[RankFailure] = []
    lock = threading.Lock()
    procs: list[_Node] = []
    stop_signal: list[int] = []
    first_signal_at = [0.0]
    kill_asked: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # A second signal kills the ranks now; one within REPEAT_AFTER_S is the first delivered twice.
        if not stop_signal:
            first_signal_at[0] = time.monotonic()
            stop_signal.append(signum)
        elif time.monotonic() - first_signal_at[0] >= REPEAT_AFTER_S:
            kill_asked.append(signum)

    in_main = threading.current_thread() is threading.main_thread()
    saved = {}
    if in_main:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            saved[sig] = signal.signal(sig, on_signal)
    try:
        for k, (node, is_local) in enumerate(zip(nodes, local)):
            argv = node_argv(node_config(config, k, len(nodes), node.slots, endpoint, run_id, slots, hosts))
            if is_local:
                procs.append(_Node(k, node.host, argv, None, False, failures, lock))
            else:
                # -x NAME values travel in the ssh session's environment, not in the config (see LaunchConfig)
                forwarded = forwarded_environment(environ, exported_values(config, environ))
                cmd = remote_command(node.host, argv, forwarded, cwd_for_remote(),
                                     config.ssh_port, config.ssh_identity_file, config.start_timeout,
                                     alive_timeout=silence_limit)
                if config.verbose:
                    print(f"ringtrain run: node {k} on {node.host}: {' '.join(cmd)}", file=sys.stderr)
                procs.append(_Node(k, node.host, cmd, None, True, failures, lock))
            store_host.send_secret(procs[-1].proc.stdin, secret)
        stopping_since: float | None = None
        killing = False
        beat_interval = min(BEAT_INTERVAL, peer_timeout / 4)
        next_beat = 0.0
        while any(p.proc.poll() is None for p in procs):
            now = time.monotonic()
            if now >= next_beat:
                for p in procs:
                    p.beat()
                next_beat = now + beat_interval
            lost_contact = False
            for p in procs:
                if stopping_since is None and p.ended_early is None and p.proc.poll() not in (None, 0):
                    p.ended_early = time.time()
                if stopping_since is None and p.check_silence(silence_limit):
                    lost_contact = True
                    p.kill()  # its ssh waits on a dead connection: nothing more will come through it
            bad = (stop_signal or failures or lost_contact
                   or any(p.proc.poll() not in (None, 0) for p in procs))
            if bad and stopping_since is None:
                stopping_since = time.monotonic()
                if stop_signal:
                    print(f"ringtrain run: {stopping_line(stop_signal[0], where=' on every host')}",
                          file=sys.stderr, flush=True)
                for p in procs:
                    p.stop()
            if kill_asked and not killing:
                killing = True
                print(f"ringtrain run: {killing_line(kill_asked[0], where=' on every host')}",
                      file=sys.stderr, flush=True)
                for p in procs:
                    p.kill_ranks()
            if stopping_since is not None and time.monotonic() - stopping_since > SHUTDOWN_GRACE:
                for p in procs:
                    p.kill()
            time.sleep(0.05)
        for p in procs:
            for t in p.threads:
                t.join(timeout=5)
    finally:
        for p in procs:
            p.kill()
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if stop_signal:
        print(f"ringtrain run: stopped by {signal.Signals(stop_signal[0]).name}; every rank on every host "
              "was stopped.", file=sys.stderr)
        return 128 + stop_signal[0]
    reported = {f.host for f in failures}
    # Agents that ended with an error on their own (not stopped by us) and said nothing about their
    # ranks: killed, or their host became unreachable. Such an event can be the root cause too.
    lost = [p.lost() for p in procs if p.ended_early is not None and p.host not in reported]
    root = earliest([*failures, *lost])
    if root is None:
        broken = [p for p in procs if p.proc.returncode not in (0, None)]
        if not broken:
            return 0
        root = broken[0].lost()
    print(format_report(root, len(failures) + len(lost) or 1, world_size=plan.num_proc), file=sys.stderr,
          flush=True)
    for other in lost:
        if other is not root:
            print(f"ringtrain run: also: {other.message}", file=sys.stderr, flush=True)
    return 1
