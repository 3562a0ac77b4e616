"""A job of a fixed size: start the ranks the plan asks for, wait, and report the first failure once.

One node here: the elastic agent runs in this process. Several hosts: this process is a driver that
starts one agent per host (``python -m ringtrain.launch.node_entry CONFIG_JSON``; directly for this
machine, over ssh for the others), relays their output, stops all of them as soon as one fails, and
prints the earliest failure of all hosts as the root cause. Inside a Slurm batch script spanning
several nodes, ``srun`` starts one such agent per node instead. Each agent (or the srun step) is a
group of :mod:`ringtrain.launch.supervision` on a place of :mod:`ringtrain.launch.places`; an agent's
side of the link to this driver is :mod:`ringtrain.launch.link`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from ringtrain import __version__
from ringtrain.engine.auth import ENV_SECRET
from ringtrain.engine.netutil import check_port_free, free_port
from ringtrain.engine.settings import check_environ, read_knob
from ringtrain.exceptions import SettingError, UsageError
from ringtrain.launch import link, store_host, supervision
from ringtrain.launch.agent import NodeSpec, run_node
from ringtrain.launch.config import DriverLink, LaunchConfig, exported_values, worker_environment
from ringtrain.launch.forwarding import forwarding
from ringtrain.launch.hosts import HostSlots, assign_slots, is_local_host, is_loopback_name, nodes_of
from ringtrain.launch.places import PLACES
from ringtrain.launch.places.srun import srun_command
from ringtrain.launch.plan import HostsPlan, NodePlan, SrunPlan, resolve_plan
from ringtrain.launch.remote import forwarded_environment, probe_hosts
from ringtrain.launch.report import (
    PREEMPTED_EXIT,
    RankFailure,
    earliest,
    format_report,
    preempted,
    preempted_line,
)
from ringtrain.launch.stopping import stopping_line
from ringtrain.launch.worker_entry import is_python

if TYPE_CHECKING:
    from ringtrain.watch.job import JobWatch


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


def launch_fixed(config: LaunchConfig, environ: dict[str, str]) -> int:
    """A job of a fixed size: on this node, on hosts (ssh and this machine), or one agent per node of an
    ``srun`` step, as the plan says; the exit code. Called by :func:`ringtrain.launch.entry.launch`."""
    prepare(config, environ)
    plan = resolve_plan(config, environ)
    if config.verbose:
        print(f"ringtrain run: plan {plan}", file=sys.stderr)
    if isinstance(plan, SrunPlan):
        return relaunch_with_srun(config, plan)
    if isinstance(plan, HostsPlan):
        return _launch_hosts(config, plan, environ)
    return _launch_node(config, plan, environ)


def prepare(config: LaunchConfig, environ: Mapping[str, str]) -> None:
    """What every launch does before it starts anything: the notes, the resolved configuration
    (--verbose), and the checks of -x values, --log-dir and the workers' settings."""
    for note in config.notes:
        print(f"ringtrain run: warning: {note}", file=sys.stderr)
    if config.verbose:
        print("ringtrain run: resolved configuration\n" + config.table(), file=sys.stderr)
    exported_values(config, environ)  # a bare -x NAME that is not set here fails before anything starts
    if config.log_dir:
        check_log_dir(config.log_dir)
    check_worker_settings(config, environ)


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


def local_endpoint(config: LaunchConfig) -> str:
    """The store of a job on this node alone: ``--master-addr``/``--master-port`` when given, else a free
    local port. ``--standalone`` ignores them, as torchrun does: in a pod they come from the operator's
    ``PET_MASTER_*`` and name another pod, where no store of this job will ever listen."""
    if config.standalone:
        return f"127.0.0.1:{free_port()}"
    if config.master_port:
        check_port_free(config.master_port)
    return f"{config.master_addr or '127.0.0.1'}:{config.master_port or free_port()}"


def _whole_job_here(config: LaunchConfig) -> bool:
    """A driver started this agent and every rank of the job is on this node (``-H host:N``, or a Ray job
    whose ranks all landed on one node): the ranks talk over loopback, as a one-host job's."""
    return config.driver is not None and len(config.driver.node_slots) == 1


def _launch_node(config: LaunchConfig, plan: NodePlan, environ: Mapping[str, str],
                 node_hosts: tuple[str, ...] | None = None) -> int:
    check_command(config.command, config.no_python)
    endpoint = plan.rdzv_endpoint
    if plan.local_only:
        endpoint = local_endpoint(config)
    elif plan.node_rank == 0 and plan.rdzv_backend == "static" and is_local_host(endpoint.rpartition(":")[0]):
        check_port_free(int(endpoint.rpartition(":")[2]))
    driven = config.driver is not None
    hosts = config.driver.node_hosts if config.driver is not None else node_hosts
    # A driver's agent finds the job's secret on the first line of its stdin (see launch/link.py).
    try:
        secret = link.read_secret() if driven else None
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
        env=worker_environment(config, environ, plan.nproc, plan.local_only or _whole_job_here(config),
                               node_hosts),
        failure_marker=driven, verbose=config.verbose, log_dir=_absolute(config.log_dir),
        redirects=config.redirects, tee=config.tee, local_addr=config.local_addr, rdzv_conf=config.rdzv_conf,
        secret=secret, layout=config.driver.node_slots if config.driver is not None else None,
    )
    if driven:
        peer_timeout = read_knob("peer_timeout_s", environ)
        # the driver's requests, its silence, or its end stop this node's ranks (see launch/link.py)
        from ringtrain.watch.node import on_driver_request

        link.watch_driver(link.contact_timeout(peer_timeout, config.max_restarts),
                          spec.host or socket.gethostname(), ranks=lambda: link.live_children(os.getpid()),
                          after_stop=link.exit_when_children_gone, on_line=on_driver_request)
        link.beat_to_driver(link.beat_interval(peer_timeout, environ))
    return run_node(spec, list(config.command))


def node_config(config: LaunchConfig, node_rank: int, nnodes: int, nproc: int, endpoint: str, run_id: str,
                slots: Sequence[int], hosts: Sequence[str]) -> LaunchConfig:
    """The config of one host's agent, started by a driver: this node's part of a static rendezvous."""
    return replace(config, num_proc=None, hosts=None, nnodes=(nnodes, nnodes), nproc_per_node=nproc,
                   node_rank=node_rank, rdzv_backend="static", rdzv_endpoint=endpoint, rdzv_id=run_id,
                   master_addr=None, master_port=None, output_filename=_absolute(config.output_filename),
                   log_dir=_absolute(config.log_dir), check_build=False, notes=(), requeue=False,
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
                   check_build=False, notes=(), requeue=False)
    # --requeue: the nodes end preempted one after another; srun must not kill the later ones as they
    # end (its status would be 143, not 75). A node that fails still ends the others through
    # ringtrain's own failure detection.
    srun = srun_command(plan.nnodes, node_argv(task), kill_on_bad_exit=not config.requeue)
    if config.verbose:
        print("ringtrain run: inside a Slurm batch job, re-launching through: " + " ".join(srun),
              file=sys.stderr)
    # srun hands its environment to every task: the secret reaches each node's agent there, not in argv.
    env = dict(os.environ)
    env[ENV_SECRET] = store_host.node_secret(env, whole_job_here=True) or ""
    srun_place = PLACES["srun"]
    assert issubclass(srun_place, supervision.ProcessGroup)  # a child process: srun
    step = srun_place("srun", srun, env)
    try:
        with forwarding(step.forward_signal):  # srun passes them on to every node's agent
            return step.wait()
    except KeyboardInterrupt:
        step.stop()
        return step.wait()


def _launch_hosts(config: LaunchConfig, plan: HostsPlan, environ: Mapping[str, str]) -> int:
    nodes = nodes_of(assign_slots(plan.hosts, plan.num_proc))
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
    return HostsJob(config, plan, environ, nodes, local).run()


def rendezvous_endpoint(config: LaunchConfig, first: str, first_is_local: bool, all_local: bool) -> str:
    """Where the nodes of a driven job meet: node 0's host and a port (checked free when it is here)."""
    addr = config.master_addr or first
    if first_is_local and is_loopback_name(addr) and not all_local:
        addr = socket.getfqdn()
    if config.master_port:
        port = config.master_port
        if first_is_local:
            check_port_free(port)
    else:
        port = free_port() if first_is_local else 29400 + os.getpid() % 1000
    return f"{addr}:{port}"


class HostsJob:
    """A multi-host job as its driver runs it: one agent per host (a group of
    :mod:`ringtrain.launch.supervision`), all stopped as soon as one fails, the earliest failure
    reported as the root cause."""

    def __init__(self, config: LaunchConfig, plan: HostsPlan, environ: Mapping[str, str],
                 nodes: list[HostSlots], local: list[bool]) -> None:
        self.config, self.plan, self.environ = config, plan, environ
        self.nodes, self.local = nodes, local
        peer_timeout = float(read_knob("peer_timeout_s", environ))
        self.peer_timeout = peer_timeout
        self.silence_limit = link.contact_timeout(peer_timeout, config.max_restarts)
        self.pulse = supervision.Pulse(link.beat_interval(peer_timeout))
        self.failures: list[RankFailure] = []
        self.lock = threading.Lock()
        self.agents: list[supervision.RankGroup] = []
        #: When an agent was seen to end with an error (or given up as silent) before the driver
        #: asked anything of it, by node index.
        self.ended_early: dict[int, float] = {}
        self.signals = supervision.StopSignals()
        self.job_watch = self._job_watch()

    def _job_watch(self) -> JobWatch | None:
        """The watch over every host's ranks (None: turned off); the agents send it what they see."""
        from ringtrain.watch.job import JobWatch
        from ringtrain.watch.node import WatchSettings

        try:
            settings = WatchSettings.from_env({**self.environ, **self.config.worker_env})
        except ValueError:
            return None  # the command line refused a bad value before; a bad variable: not watched
        if not settings.enabled or not self.plan.num_proc:
            return None
        return JobWatch(self.plan.num_proc, say=lambda text: print(text, file=sys.stderr, flush=True),
                        settings=settings, ask_for_stacks=self._ask_for_stacks)

    def _ask_for_stacks(self, request: bytes) -> int:
        from ringtrain.watch.node import STACKS_REQUEST_LINE

        line = STACKS_REQUEST_LINE + b" " + request
        return sum(1 for agent in self.agents if agent.request(line))

    def run(self) -> int:
        try:
            # a scheduler's warning (SIGUSR1) goes on to every host's agent, which passes it to its ranks
            with self.signals, forwarding(lambda signum: [a.forward_signal(signum) for a in self.agents]):
                self.start_agents()
                if self.job_watch is not None:
                    self.job_watch.start()
                if self.watch():
                    self.stop()
                for agent in self.agents:
                    agent.join_output(timeout=5)
        finally:
            for agent in self.agents:
                agent.kill()
            if self.job_watch is not None:
                self.job_watch.stop()
        return self.outcome()

    def start_agents(self) -> None:
        config, nodes = self.config, self.nodes
        endpoint = rendezvous_endpoint(config, nodes[0].host, self.local[0], all(self.local))
        run_id = config.rdzv_id or uuid.uuid4().hex[:12]
        secret = store_host.node_secret(self.environ, whole_job_here=True)
        slots, hosts = [n.slots for n in nodes], [n.host for n in nodes]
        # -x NAME values travel in the ssh session's environment, not in the config (see LaunchConfig)
        forwarded = forwarded_environment(self.environ, exported_values(config, self.environ))
        reach = supervision.Reach(port=config.ssh_port, identity_file=config.ssh_identity_file,
                                  connect_timeout=config.start_timeout, alive_timeout=self.silence_limit)
        for k, (node, is_local) in enumerate(zip(nodes, self.local)):
            argv = node_argv(node_config(config, k, len(nodes), node.slots, endpoint, run_id, slots, hosts))
            place = PLACES["local" if is_local else "ssh"]
            assert issubclass(place, supervision.ProcessGroup)  # local and ssh: child processes
            agent = place(node.host, argv, None if is_local else forwarded, reach=reach, lock=self.lock,
                          on_error_line=self._take_marker)
            if config.verbose and not is_local:
                print(f"ringtrain run: node {k} on {node.host}: {' '.join(agent.command_line)}",
                      file=sys.stderr)
            self.agents.append(agent)
            link.send_secret(agent.proc.stdin, secret)

    def _take_marker(self, line: str) -> bool:
        """An agent's failure marker (or its watch's lines) is the driver's to report, not the console's."""
        if self.job_watch is not None and self.job_watch.take(line.rstrip("\n")):
            return True
        failure = RankFailure.from_marker(line.rstrip("\n"))
        if failure is None:
            return False
        with self.lock:
            self.failures.append(failure)
        return True

    def watch(self) -> bool:
        """Run until every agent ended (False) or the job must stop (True): a signal, a failure, an
        agent that ended with an error, or a host gone silent."""
        while any(agent.poll() is None for agent in self.agents):
            self.pulse(self.agents)
            lost_contact = False
            for k, agent in enumerate(self.agents):
                if k not in self.ended_early and agent.poll() not in (None, 0):
                    self.ended_early[k] = time.time()
                if agent.check_silence(self.silence_limit):
                    self.ended_early[k] = time.time()
                    lost_contact = True
                    agent.kill()  # its ssh waits on a dead connection: nothing more will come through it
            stuck = self.job_watch is not None and self.job_watch.verdict is not None
            if (self.signals.first is not None or self.failures or lost_contact or stuck
                    or any(agent.poll() not in (None, 0) for agent in self.agents)):
                return True
            time.sleep(supervision.TICK)
        return False

    def stop(self) -> None:
        if self.signals.first is not None:
            say(stopping_line(self.signals.first, where=" on every host"))
        supervision.stop_all(self.agents, self.signals, say)

    def outcome(self) -> int:
        """The exit code; the root-cause report first where the job failed."""
        if self.signals.first is not None:
            if all(agent.poll() == PREEMPTED_EXIT for agent in self.agents):
                # every host's ranks heard the stop, wrote their snapshot and ended resumably (a
                # scheduler's SIGTERM to a Trainer job): preempted, not stopped halfway
                say(preempted_line(f"the ranks of {len(self.agents)} host(s)"))
                return PREEMPTED_EXIT
            print(f"ringtrain run: stopped by {signal.Signals(self.signals.first).name}; every rank on every "
                  "host was stopped.", file=sys.stderr)
            return 128 + self.signals.first
        reported = {f.host for f in self.failures}
        # Agents that ended with an error on their own (not stopped by us) and said nothing about their
        # ranks: killed, or their host became unreachable. Such an event can be the root cause too.
        lost = [self.lost(k) for k, agent in enumerate(self.agents)
                if k in self.ended_early and agent.host not in reported]
        if not lost and preempted(self.failures):
            say(preempted_line(f"the ranks of {len(self.failures)} host(s)"))
            return PREEMPTED_EXIT
        root = earliest([*self.failures, *lost])
        verdict = self.job_watch.verdict if self.job_watch is not None else None
        if verdict is not None:  # the watch stopped the job: its report is the root cause
            root = RankFailure(host=verdict.host, rank=verdict.rank, local_rank=-1, exitcode=1,
                               pid=verdict.pid, time=verdict.time, message=verdict.message,
                               traceback=verdict.traceback, hint=verdict.hint,
                               state="stuck, ended by the watch (every rank stopped)")
        if root is None:
            broken = [k for k, agent in enumerate(self.agents) if agent.poll() not in (0, None)]
            if not broken:
                return 0
            root = self.lost(broken[0])
        print(format_report(root, len(self.failures) + len(lost) or 1, world_size=self.plan.num_proc,
                            others=self.failures), file=sys.stderr, flush=True)
        for other in lost:
            if other is not root:
                print(f"ringtrain run: also: {other.message}", file=sys.stderr, flush=True)
        return 1

    def lost(self, k: int) -> RankFailure:
        """The root-cause record of node ``k``'s agent, which ended with an error and no report of its
        ranks."""
        agent = self.agents[k]
        code = agent.poll()
        if agent.silent_for is not None:
            message = (f"lost contact with host {agent.host}: no word from its agent for "
                       f"{agent.silent_for:.0f} s (RINGTRAIN_PEER_TIMEOUT_SECONDS, with --max-restarts at "
                       "least the rendezvous' node timeout): the host is down or the network to it is cut")
        else:
            message = agent.describe_end(f"the agent of node {k}")
        return RankFailure(host=agent.host, rank=-1, local_rank=-1, exitcode=code if code is not None else -1,
                           pid=agent.pid, time=self.ended_early.get(k) or time.time(),
                           output_tail="".join(agent.tail), message=message,
                           state="unreachable" if agent.silent_for is not None else "")


def say(text: str) -> None:
    """One line of the driver's own on stderr."""
    print(f"ringtrain run: {text}", file=sys.stderr, flush=True)
