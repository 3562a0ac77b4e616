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
from ringtrain.exceptions import UsageError
from ringtrain.launch.agent import NodeSpec, run_node
from ringtrain.launch.config import DriverLink, LaunchConfig, worker_environment
from ringtrain.launch.hosts import assign_slots, is_local_host, is_loopback_name, nodes_of
from ringtrain.launch.plan import HostsPlan, NodePlan, SrunPlan, check_port_free, free_port, resolve_plan
from ringtrain.launch.remote import cwd_for_remote, forwarded_environment, probe_hosts, remote_command
from ringtrain.launch.report import RankFailure, earliest, format_report
from ringtrain.launch.worker_entry import is_python

#: Seconds an agent gets to stop its ranks after SIGTERM before it is killed.
SHUTDOWN_GRACE = 30.0


def check_command(command: Sequence[str]) -> None:
    """Refuse a command that cannot start, before any rank is spawned."""
    program = command[0]
    script = None
    if is_python(program):
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
    if config.elastic:
        from ringtrain.launch.elastic_driver import launch_elastic

        return launch_elastic(config, environ)
    plan = resolve_plan(config, environ)
    if config.verbose:
        print(f"ringtrain run: plan {plan}", file=sys.stderr)
    if isinstance(plan, SrunPlan):
        return relaunch_with_srun(config, plan)
    if isinstance(plan, HostsPlan):
        return _launch_hosts(config, plan, environ)
    return _launch_node(config, plan, environ)


def _launch_node(config: LaunchConfig, plan: NodePlan, environ: Mapping[str, str],
                 node_hosts: tuple[str, ...] | None = None) -> int:
    check_command(config.command)
    endpoint = plan.rdzv_endpoint
    if plan.local_only:
        if config.master_port:
            check_port_free(config.master_port)
        endpoint = f"{config.master_addr or '127.0.0.1'}:{config.master_port or free_port()}"
    elif plan.node_rank == 0 and plan.rdzv_backend == "static" and is_local_host(endpoint.rpartition(":")[0]):
        check_port_free(int(endpoint.rpartition(":")[2]))
    driven = config.driver is not None
    hosts = config.driver.node_hosts if config.driver is not None else node_hosts
    spec = NodeSpec(
        nproc=plan.nproc, node_rank=plan.node_rank, min_nodes=plan.min_nodes, max_nodes=plan.max_nodes,
        rdzv_backend=plan.rdzv_backend, rdzv_endpoint=endpoint, run_id=plan.run_id,
        rdzv_timeout=max(config.start_timeout, 1.0) * 4, max_restarts=config.max_restarts,
        host=hosts[plan.node_rank] if hosts and plan.node_rank < len(hosts) else None,
        output_dir=config.output_filename,
        env=worker_environment(config, environ, plan.nproc, plan.local_only, node_hosts),
        failure_marker=driven, verbose=config.verbose,
    )
    watcher = _watch_stdin() if driven else None
    try:
        return run_node(spec, list(config.command))
    finally:
        del watcher


def _watch_stdin() -> threading.Thread:
    """A driver's agents stop when the driver goes away: EOF on stdin means SIGTERM to ourselves.

    The agent's main thread can sit in a blocking store call (the exit barrier after its ranks
    finished, or a rendezvous) where Python signal handlers do not run; once none of our worker
    processes is left, exiting at once is safe, so the watcher does that.
    """
    def watch() -> None:
        # os.read on the raw descriptor: a daemon thread blocked in sys.stdin would hold its lock at exit.
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        os.kill(os.getpid(), signal.SIGTERM)
        while True:
            time.sleep(1.0)
            if not live_children(os.getpid()):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(128 + signal.SIGTERM)

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
                   check_build=False, notes=(), driver=DriverLink(tuple(slots), tuple(hosts)))


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
                   output_filename=_absolute(config.output_filename), check_build=False, notes=())
    srun = ["srun", f"--nodes={plan.nnodes}", f"--ntasks={plan.nnodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", *node_argv(task)]
    if config.verbose:
        print("ringtrain run: inside a Slurm batch job, re-launching through: " + " ".join(srun),
              file=sys.stderr)
    proc = subprocess.Popen(srun)
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
        self.threads = [threading.Thread(target=self._relay, args=(self.proc.stdout, sys.stdout, False),
                                         daemon=True),
                        threading.Thread(target=self._relay, args=(self.proc.stderr, sys.stderr, True),
                                         daemon=True)]
        for t in self.threads:
            t.start()

    def _relay(self, stream: object, dest: object, is_err: bool) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            line = raw.decode(errors="replace")
            failure = RankFailure.from_marker(line.rstrip("\n")) if is_err else None
            with self.lock:
                if failure is not None:
                    self.failures.append(failure)
                    continue
                if is_err:
                    self.errors = (self.errors + [line])[-20:]
                dest.write(line)  # type: ignore[attr-defined]
                dest.flush()  # type: ignore[attr-defined]

    def stop(self) -> None:
        """Ask the agent to stop its ranks: EOF on its stdin (also over ssh), SIGTERM when local."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        if not self.remote and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

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
        check_command(config.command)
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
    slots = [n.slots for n in nodes]
    hosts = [n.host for n in nodes]
    failures: list[RankFailure] = []
    lock = threading.Lock()
    procs: list[_Node] = []
    stop_signal: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_signal.append(signum)

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
                cmd = remote_command(node.host, argv, forwarded_environment(environ), cwd_for_remote(),
                                     config.ssh_port, config.ssh_identity_file, config.start_timeout)
                if config.verbose:
                    print(f"ringtrain run: node {k} on {node.host}: {' '.join(cmd)}", file=sys.stderr)
                procs.append(_Node(k, node.host, cmd, None, True, failures, lock))
        stopping_since: float | None = None
        while any(p.proc.poll() is None for p in procs):
            bad = stop_signal or failures or any(p.proc.poll() not in (None, 0) for p in procs)
            if bad and stopping_since is None:
                stopping_since = time.monotonic()
                for p in procs:
                    p.stop()
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
    root = earliest(failures)
    if root is None:
        broken = [p for p in procs if p.proc.returncode not in (0, None)]
        if not broken:
            return 0
        p = broken[0]
        root = RankFailure(host=p.host, rank=-1, local_rank=-1, exitcode=p.proc.returncode, pid=p.proc.pid,
                           time=time.time(), output_tail="".join(p.errors),
                           message=f"the agent of node {p.index} ({'ssh' if p.remote else 'local'}) "
                           "ended without a report")
    print(format_report(root, len(failures) or 1, world_size=plan.num_proc), file=sys.stderr, flush=True)
    return 1
