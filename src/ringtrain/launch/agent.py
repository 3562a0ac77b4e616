"""One node's ranks, started and watched by torch's elastic agent (``torch.distributed.launcher``).

The agent runs in this process. Workers start as ``python -m ringtrain.launch.worker_entry COMMAND``
so that they get Horovod's variables too. When a worker fails the agent stops the others and this
module turns its failure record into a :class:`~ringtrain.launch.report.RankFailure`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ringtrain.env.slurm import in_slurm_step
from ringtrain.exceptions import UsageError
from ringtrain.launch.environ import patched_environ
from ringtrain.launch.forwarding import forwarding, signal_pids
from ringtrain.launch.report import (
    PREEMPTED_EXIT,
    RankFailure,
    asks_for_gpu,
    earliest,
    format_report,
    no_gpu_hint,
    preempted,
    preempted_line,
)
from ringtrain.launch.worker_entry import AGENT_PID_VARIABLE

if TYPE_CHECKING:  # torch is imported when the agent starts, not when the launcher does
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from ringtrain.launch.rendezvous import NodeMeeting
    from ringtrain.launch.restarts import GroupAgent, Restart
    from ringtrain.watch.node import NodeWatch, Verdict

_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher")


@dataclass(frozen=True)
class NodeSpec:
    """What the agent of one node needs: its ranks and where the nodes meet."""

    nproc: int
    node_rank: int = 0
    min_nodes: int = 1
    max_nodes: int = 1
    rdzv_backend: str = "static"
    rdzv_endpoint: str = "127.0.0.1:29500"
    run_id: str = "ringtrain"
    rdzv_timeout: float = 60.0
    max_restarts: int = 0
    host: str | None = None
    """This node's name in failure reports (None: its host name)."""
    output_dir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the workers get on top of this process's environment."""
    failure_marker: bool = False
    """Report a failure as a marker line for the driver that started this agent, not as a report."""
    verbose: bool = False
    log_dir: str | None = None
    """Keep the ranks' output files here (None: a temporary folder, removed at the end)."""
    redirects: str | None = None
    """torchrun's stream selector of what stays off the console (files only)."""
    tee: str | None = None
    """torchrun's stream selector of what goes to the console and the files (wins over ``redirects``)."""
    local_addr: str | None = None
    """This node's address for the rendezvous (torch's ``local_addr``)."""
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    """Extra rendezvous settings; they win over the ones derived here (``timeout``)."""
    secret: str | None = field(default=None, repr=False)
    """The job's secret, when a driver handed one over (else: the environment's, or a new one)."""
    layout: tuple[int, ...] | None = None
    """Ranks on every node in node-rank order, when a driver knows them (else ``nproc`` everywhere)."""


def _seconds(value: object, name: str) -> float:
    """A positive number of seconds from a rendezvous setting, or a usage error naming it."""
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise UsageError(f"{name}={value!r} is not a positive number of seconds. HINT: e.g. {name}=900.")
    return seconds


@contextlib.contextmanager
def quiet_torch_logs(verbose: bool) -> Iterator[None]:
    """The agent logs every failure itself; we report once, so its loggers stay quiet unless --verbose."""
    # torch gives each of its elastic loggers its own level, so every existing child is set too.
    names = [name for name in logging.Logger.manager.loggerDict if name.startswith(_TORCH_LOGGERS)]
    loggers = [logging.getLogger(name) for name in {*_TORCH_LOGGERS, *names}]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO if verbose else logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def kept_signal_handlers() -> Iterator[None]:
    """The agent installs its own SIGTERM/SIGINT handlers; put ours back when it is done."""
    names = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {name: signal.getsignal(getattr(signal, name)) for name in names if hasattr(signal, name)}
    try:
        yield
    finally:
        for name, handler in saved.items():
            if handler is not None:
                signal.signal(getattr(signal, name), handler)


#: Prefix of an agent's temporary folder (the ranks' logs and error files when there is no --log-dir).
RUN_FOLDER_PREFIX = "ringtrain-run-"


def run_folder() -> Path:
    """A new temporary folder for this agent's ranks, named for this host and pid.

    An agent killed with SIGKILL (an OOM kill, a far host's agent whose launcher killed it) cannot
    remove its folder; the next agent started on the host removes those whose agent is gone
    (:mod:`ringtrain.launch.temp_folders`), as the launchers' own folders are.
    """
    from ringtrain.launch.temp_folders import make_temp_folder

    return make_temp_folder(RUN_FOLDER_PREFIX)


def _tail(path: str | None, lines: int = 20) -> str:
    if not path or not os.path.isfile(path):
        return ""
    try:
        with open(path, errors="replace") as fp:
            return "".join(fp.readlines()[-lines:])
    except OSError:
        return ""


def _error_of(message_data: object, when: float) -> tuple[str, str, float]:
    """(message, traceback, time) of a rank's error file's ``message`` field, in the agent's layout (a
    dict where the worker wrote the file: worker_entry, or torch's @record); ``when`` where it has none."""
    if not isinstance(message_data, dict):
        return "", "", when
    extra = message_data.get("extraInfo") or {}
    with contextlib.suppress(TypeError, ValueError):
        when = float(extra.get("time", extra.get("timestamp", when)))
    return str(message_data.get("message", "")), str(extra.get("py_callstack", "")), when


def _failure_from(rank: int, failure: ProcessFailure, host: str, stderr_path: str | None) -> RankFailure:
    message, trace, when = _error_of(failure.error_file_data.get("message"), float(failure.timestamp))
    found = RankFailure(host=host, rank=rank, local_rank=failure.local_rank, exitcode=failure.exitcode,
                        pid=failure.pid, time=when, message=message, traceback=trace,
                        output_tail="" if trace else _tail(stderr_path))
    if asks_for_gpu(found) and not _cuda_visible():
        found = replace(found, hint=no_gpu_hint(host))
    return found


def _cuda_visible() -> bool:
    """``torch.cuda.is_available()`` on this host (the rank's), asked only when a rank failed."""
    import torch

    return bool(torch.cuda.is_available())


@dataclass
class _NodeRun:
    """One ``run_node`` call: what its outcomes read to say how the node's ranks ended."""

    spec: NodeSpec
    host: str
    log_dir: str
    history: list[tuple[Restart, list[RankFailure]]] = field(default_factory=list)
    agents: list[GroupAgent] = field(default_factory=list)
    watch: NodeWatch | None = None

    def failures(self, found: Mapping[int, ProcessFailure]) -> list[RankFailure]:
        """torch's failure records of ranks (by global rank) as this node's failure reports; a rank the
        watch ended as stuck carries the watch's report (the job's root cause)."""
        failures = [_failure_from(rank, pf, self.host,
                                  _stderr_path(self.log_dir, self.spec.output_dir, rank, pf.local_rank))
                    for rank, pf in found.items()]
        verdict = self.watch.forget_verdict() if self.watch is not None else None
        return _with_verdict(failures, verdict) if verdict is not None else failures

    def ranks_now(self) -> list[int]:
        return self.agents[0].rank_pids() if self.agents else []


def _with_verdict(failures: list[RankFailure], verdict: Verdict) -> list[RankFailure]:
    """The failures with the stuck rank's replaced by the watch's report of it, timed when it was made
    (before the watch ended the rank, so before any failure that ending caused)."""
    stuck = [replace(f, time=verdict.time, message=verdict.message, traceback=verdict.traceback,
                     output_tail="", hint=verdict.hint, state=f"stuck, ended by the watch ({f.status()})")
             for f in failures if f.rank == verdict.rank]
    if not stuck:
        stuck = [RankFailure(host=verdict.host, rank=verdict.rank, local_rank=-1, exitcode=1, pid=verdict.pid,
                             time=verdict.time, message=verdict.message, traceback=verdict.traceback,
                             hint=verdict.hint, state="stuck, ended by the watch")]
    return stuck + [f for f in failures if f.rank != verdict.rank]


def _start_watch(run: _NodeRun, env: dict[str, str], say: Callable[[str], None]) -> NodeWatch | None:
    """The watch of this node's ranks unless the launcher turned it off: it decides when the whole job
    runs here, and sends what it sees to the driver of a multi-host job; ``env`` (the workers'
    variables) gets what the ranks' probes need."""
    from ringtrain.watch.node import STALL_SHUTDOWN_VARIABLE, NodeWatch, WatchSettings
    from ringtrain.watch.probe import WATCH_DIR_VARIABLE

    try:
        settings = WatchSettings.from_env({**os.environ, **env})
    except ValueError as exc:
        say(f"ringtrain run: the watch is off: {exc}")
        return None
    if not settings.enabled:
        return None
    relay = None
    if run.spec.max_nodes != 1:
        # Across nodes a rank's progress is compared with ranks this agent does not see: a multi-host
        # driver decides over all of them (ringtrain.watch.job); without one (srun, torchrun's nodes)
        # nobody does yet.
        if not run.spec.failure_marker:
            return None
        relay = say  # marker lines on stderr, between whole lines of the ranks' output
    folder = Path(run.log_dir) / "watch"
    folder.mkdir(parents=True, exist_ok=True)
    env[WATCH_DIR_VARIABLE] = str(folder)
    if "TORCH_FR_BUFFER_SIZE" not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        from ringtrain.watch.node import FLIGHT_RECORDER_ENTRIES

        env["TORCH_FR_BUFFER_SIZE"] = FLIGHT_RECORDER_ENTRIES  # names the collective a stuck rank is in
    if settings.hang_timeout:
        env[STALL_SHUTDOWN_VARIABLE] = "0"  # the watch ends the job, naming the rank waited for
    return NodeWatch(folder, run.host, run.ranks_now, say, settings, relay=relay).start()


def run_node(spec: NodeSpec, command: list[str]) -> int:
    """Start ``spec.nproc`` ranks of ``command`` on this node; returns the exit code for the launcher.

    On failure prints the root-cause report (or a marker line for a driver) and returns 1 (2 when the
    nodes were started with settings that disagree). With ``max_restarts`` every failure of a rank
    restarts the whole group (on every node) until the restarts run out; each restart is announced
    on stderr as it happens and listed in the final report. A SIGTERM or SIGINT stops every rank and
    returns 128 + the signal number. How each way of ending maps to its exit code: :func:`_outcomes`.
    """
    from ringtrain.launch.logs import ConsoleRelay, RankLogsSpecs
    from ringtrain.launch.restarts import run_agent
    from ringtrain.launch.stopping import StopGuard

    run = _NodeRun(spec, spec.host or socket.gethostname(), spec.log_dir or str(run_folder()))
    relay = ConsoleRelay(sys.stdout, sys.stderr)
    logs = RankLogsSpecs(log_dir=run.log_dir, output_dir=spec.output_dir, redirects=spec.redirects,
                         tee=spec.tee, relay=relay)
    torch_config, env, meeting = _agent_setup(spec, run.host, logs, relay.worker_variables())
    run.watch = _start_watch(run, env, relay.say)
    # The agent runs every argument through string.Template (its ${local_rank} macro), which turns "$$"
    # into "$"; doubling each "$" hands the user's arguments over unchanged.
    args = ["-u", "-m", "ringtrain.launch.worker_entry", *(arg.replace("$", "$$") for arg in command)]
    # A driver that started this agent speaks to the user itself; a signal reaches us from it.
    guard = StopGuard(run.ranks_now, interactive=not spec.failure_marker)

    def on_restart(restart: Restart) -> None:
        failures = run.failures(restart.failures)
        run.history.append((restart, failures))
        print(f"ringtrain run: {_restart_line(restart, failures, run.host)}", file=sys.stderr, flush=True)

    def forward(signum: int) -> None:
        # An srun task's signals reach every process of its step from Slurm itself (the ranks too); a
        # second copy from here could arrive while a rank exits, when Python has put the default action
        # back, and kill it with that signal instead of its own status.
        if not in_slurm_step(os.environ):
            signal_pids(run.ranks_now(), signum)

    try:
        # A scheduler's warning (SIGUSR1) to this agent goes on to its ranks (launch/forwarding.py).
        with patched_environ(env), quiet_torch_logs(spec.verbose), kept_signal_handlers(), \
                forwarding(forward):
            relay.start()
            try:
                if meeting is not None:
                    from ringtrain.engine.auth import ENV_ADDRESS

                    torch_config.rdzv_configs.update(meeting.open())
                    os.environ[ENV_ADDRESS] = meeting.address
                run_agent(torch_config, sys.executable, args, on_restart=on_restart,
                          on_agent=run.agents.append, stop_guard=guard)
            finally:
                relay.stop()  # every rank's output is out before a failure report follows it
        return _finished(run)
    except (Exception, KeyboardInterrupt) as exc:
        for kind, outcome in _outcomes():
            if isinstance(exc, kind):
                return outcome(run, exc)
        raise  # not reached: the table ends with Exception and KeyboardInterrupt
    finally:
        if meeting is not None:
            meeting.close(run.agents[0].get_worker_group().spec.rdzv_handler if run.agents else None)
        sys.stdout.flush()
        sys.stderr.flush()
        if run.watch is not None:
            run.watch.stop()
        if not spec.log_dir:
            shutil.rmtree(run.log_dir, ignore_errors=True)
        guard.finish()


def _agent_setup(spec: NodeSpec, host: str, logs: Any,
                 relay_variables: Mapping[str, str]) -> tuple[Any, dict[str, str], NodeMeeting | None]:
    """torch's launch config for this node, the variables its workers get, and the meeting on node 0's
    job store (None with torch's own c10d rendezvous)."""
    from torch.distributed.launcher.api import LaunchConfig as TorchLaunchConfig

    from ringtrain.engine.auth import ENV_ADDRESS, ENV_SECRET
    from ringtrain.launch import store_host
    from ringtrain.launch.rendezvous import BACKEND, NodeMeeting, NodeView
    from ringtrain.launch.stopping import STOP_SIGNALS

    rdzv_configs: dict[str, object] = {"timeout": int(max(spec.rdzv_timeout, 1)), **spec.rdzv_conf}
    # --rdzv-conf timeout=N bounds the meeting like torchrun's (it overrides --start-timeout's value)
    rdzv_timeout = _seconds(rdzv_configs["timeout"], "--rdzv-conf timeout")
    if spec.rdzv_backend == "static":
        rdzv_configs["rank"] = spec.node_rank
    # "static" (torchrun's fixed membership) is served by ringtrain's own handler; c10d stays torch's.
    backend = BACKEND if spec.rdzv_backend == "static" else spec.rdzv_backend
    torch_config = TorchLaunchConfig(
        min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, nproc_per_node=spec.nproc, logs_specs=logs,
        run_id=spec.run_id, role="ringtrain", rdzv_endpoint=spec.rdzv_endpoint,
        rdzv_backend=backend, rdzv_configs=rdzv_configs, max_restarts=spec.max_restarts,
        monitor_interval=0.1, local_addr=spec.local_addr,
    )
    env = {**relay_variables, **spec.env}
    # torch 2.10+'s agent writes this into os.environ; listing it here makes patched_environ restore it.
    # Older agents have no such field and stop on the same signals without reading the variable.
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = getattr(torch_config, "signals_to_handle", ",".join(STOP_SIGNALS))
    env[AGENT_PID_VARIABLE] = str(os.getpid())  # the ranks' parent: how each learns that this agent died
    if backend != BACKEND:
        return torch_config, env, None
    secret = store_host.node_secret(os.environ, whole_job_here=spec.max_nodes == 1, given=spec.secret)
    if secret:
        env[ENV_SECRET] = secret
    # The workers meet on the same job store (node 0's); the address is final once it listens.
    env[ENV_ADDRESS] = spec.rdzv_endpoint
    endpoint_host, _, endpoint_port = spec.rdzv_endpoint.rpartition(":")
    view = NodeView.here(spec.node_rank, spec.max_nodes, spec.nproc, spec.run_id, int(endpoint_port),
                         layout=spec.layout, host=host)
    meeting = NodeMeeting(view=view, endpoint=spec.rdzv_endpoint, secret=secret,
                          bootstrap_host=endpoint_host.strip("[]") or "127.0.0.1", timeout=rdzv_timeout)
    return torch_config, env, meeting


# How a node's run ends, one function per way: each says it (or leaves it to the driver) and returns the
# launcher's exit code.

def _finished(run: _NodeRun) -> int:
    """Every rank of this node finished (after restarts, perhaps)."""
    if run.agents and run.agents[0].closed_while_finishing:
        return _node_error(run.spec, run.host, f"this node's ranks finished, but the job failed elsewhere: "
                                               f"{run.agents[0].closed_while_finishing}", 1)
    if run.history:  # recovered: what failed would go with the ranks' log folder, so it is said here
        from ringtrain.launch.report import format_earlier_attempts

        print(format_earlier_attempts([(r.attempt, r.time, found) for r, found in run.history]),
              file=sys.stderr, flush=True)
    return 0


def _ranks_failed(run: _NodeRun, exc: BaseException) -> int:
    """torch's ``ChildFailedError``: ranks failed and no restart is left."""
    found: Mapping[int, ProcessFailure] = exc.failures  # type: ignore[attr-defined]
    if all(pf.exitcode in (128 + signal.SIGINT, -signal.SIGINT) for pf in found.values()):
        # Ctrl-C on a terminal reaches the ranks too; when they end first, it is no failure to report
        return 128 + signal.SIGINT
    failures = run.failures(found)
    root = earliest(failures)
    assert root is not None
    if preempted(failures):
        return _preempted(run.spec, root, failures)
    if run.history:
        root = _with_history(root, run.history)
    _emit(run.spec, root, failures)
    return 1


def _stopped_by_signal(run: _NodeRun, exc: BaseException) -> int:
    """torch's ``SignalException``: a stop signal reached the agent (128 + its number)."""
    codes = run.agents[0].rank_exit_codes() if run.agents else []
    if codes and all(code == PREEMPTED_EXIT for code in codes):
        # the stop signal reached the ranks too, and each stopped gracefully after its snapshot
        if not run.spec.failure_marker:  # a driver's agent: the driver speaks to the user
            line = preempted_line(f"{len(codes)} rank(s)")
            print(f"ringtrain run: {line}", file=sys.stderr, flush=True)
        return PREEMPTED_EXIT
    if run.spec.failure_marker and run.agents:
        # The driver stopped this node because a rank elsewhere failed; a rank here that had already
        # failed on its own (its error file written, its exit cut short by the stop) may be the cause.
        own = [f for f in _own_errors(run) if f.message]
        first = earliest(own)
        if first is not None:
            print(first.to_marker(), file=sys.stderr, flush=True)
    return 128 + int(exc.sigval)  # type: ignore[attr-defined]


def _own_errors(run: _NodeRun) -> list[RankFailure]:
    """This node's ranks that wrote an error file, as failure reports (timed by their own clock)."""
    import json

    found = []
    for rank, local_rank, pid, path in run.agents[0].rank_errors():
        try:
            data = json.loads(Path(path).read_text()).get("message")
        except (OSError, ValueError, AttributeError):
            continue
        if not isinstance(data, dict):
            continue
        message, trace, when = _error_of(data, time.time())
        found.append(RankFailure(host=run.host, rank=rank, local_rank=local_rank, exitcode=-signal.SIGTERM,
                                 pid=pid, time=when, message=message, traceback=trace))
    return found


def _interrupted(run: _NodeRun, exc: BaseException) -> int:
    return 128 + signal.SIGINT


def _settings_disagree(run: _NodeRun, exc: BaseException) -> int:
    """The nodes met with settings that disagree: the user's to fix (2)."""
    return _node_error(run.spec, run.host, str(exc), 2)


def _meeting_failed(run: _NodeRun, exc: BaseException) -> int:
    if run.spec.failure_marker and run.agents:
        # This node lost the rendezvous (node 0 gave up after a rank failed): a rank here that had
        # already failed on its own, its error file written and its exit still under way, is the cause,
        # and the driver must hear of it as well as of the node's own failure.
        first = earliest([f for f in _own_errors(run) if f.message])
        if first is not None:
            print(first.to_marker(), file=sys.stderr, flush=True)
    return _node_error(run.spec, run.host, f"node {run.spec.node_rank}: {exc}", 1)


def _could_not_start(run: _NodeRun, exc: BaseException) -> int:
    """Rendezvous or store errors: no rank ran, so say where the nodes were to meet."""
    spec = run.spec
    failure = RankFailure(host=run.host, rank=-1, local_rank=-1, exitcode=1, pid=os.getpid(),
                          time=time.time(), message=(
                              f"node {spec.node_rank} could not start its ranks (rendezvous "
                              f"{spec.rdzv_backend} at {spec.rdzv_endpoint}): {type(exc).__name__}: {exc}"))
    if spec.failure_marker:
        print(failure.to_marker(), file=sys.stderr, flush=True)
    else:
        print(f"ringtrain run: error: {failure.message}. HINT: check that node 0 is reachable at "
              f"{spec.rdzv_endpoint} and that the port is free (--master-port).", file=sys.stderr)
    return 1


Outcome = Callable[[_NodeRun, BaseException], int]


def _outcomes() -> tuple[tuple[type[BaseException], Outcome], ...]:
    """How ``run_node`` ends on each exception, first match wins (torch's classes load with the agent)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ringtrain.exceptions import RendezvousFailedError, RendezvousMismatchError

    return (
        (ChildFailedError, _ranks_failed),
        (SignalException, _stopped_by_signal),
        (KeyboardInterrupt, _interrupted),
        (RendezvousMismatchError, _settings_disagree),
        (RendezvousFailedError, _meeting_failed),
        (Exception, _could_not_start),
    )


def _preempted(spec: NodeSpec, root: RankFailure, failures: list[RankFailure]) -> int:
    if spec.failure_marker:  # the driver says it, once for every host
        print(root.to_marker(), file=sys.stderr, flush=True)
    else:
        line = preempted_line(f"{len(failures)} rank(s)")
        print(f"ringtrain run: {line}", file=sys.stderr, flush=True)
    return PREEMPTED_EXIT


def _restart_line(restart: Any, failures: list[RankFailure], host: str) -> str:
    """What one restart says on stderr as it happens."""
    when = time.strftime("%H:%M:%S", time.localtime(restart.time))
    nxt = f"attempt {restart.attempt + 1}"
    if not failures:
        return (f"another node restarted its ranks after attempt {restart.attempt}; restarting this "
                f"node's ranks ({host}) too ({nxt})")
    first = earliest(failures)
    assert first is not None
    return (f"attempt {restart.attempt} failed at {when}: {_describe(first)}; restarting every rank "
            f"({nxt}, {restart.restarts_left} restart(s) left)")


def _describe(failure: RankFailure) -> str:
    text = f"rank {failure.rank} on {failure.host} {failure.status()}"
    return f"{text} ({failure.message})" if failure.message else text


def _with_history(last: RankFailure, history: list[tuple[Any, list[RankFailure]]]) -> RankFailure:
    """The job's first failure as the root cause, with one line per attempt (the last one included)."""
    lines = []
    for restart, found in history:
        when = time.strftime("%H:%M:%S", time.localtime(restart.time))
        first = earliest(found)
        what = _describe(first) if first is not None else "another node restarted its ranks"
        lines.append(f"attempt {restart.attempt} ended {when}: {what}; every rank restarted")
    final_attempt = history[-1][0].attempt + 1
    lines.append(f"attempt {final_attempt} ended {time.strftime('%H:%M:%S', time.localtime(last.time))}: "
                 f"{_describe(last)}; no restart left")
    firsts = [earliest(found) for _, found in history if found]
    root = firsts[0] if firsts and firsts[0] is not None else last
    return replace(root, history=tuple(lines))


def _node_error(spec: NodeSpec, host: str, message: str, code: int) -> int:
    """A failure outside the ranks (rendezvous, another node): a marker for a driver, else one error line."""
    if spec.failure_marker:
        failure = RankFailure(host=host, rank=-1, local_rank=-1, exitcode=code, pid=os.getpid(),
                              time=time.time(), message=message)
        print(failure.to_marker(), file=sys.stderr, flush=True)
    else:
        print(f"ringtrain run: error: {message}", file=sys.stderr, flush=True)
    return code


def _stderr_path(log_dir: str, output_dir: str | None, rank: int, local_rank: int) -> str | None:
    """The file that holds a rank's stderr (the agent's tee file, or ours under --output-filename)."""
    if output_dir and os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            if name.startswith("rank.") and name[5:].isdigit() and int(name[5:]) == rank:
                return os.path.join(output_dir, name, "stderr")
    # The agent's layout: <log_dir>/<run>/attempt_<n>/<local_rank>/stderr.log; the last attempt wins.
    found = None
    for root, _dirs, files in sorted(os.walk(log_dir)):
        if os.path.basename(root) == str(local_rank) and "stderr.log" in files:
            found = os.path.join(root, "stderr.log")
    return found


def _emit(spec: NodeSpec, root: RankFailure, failures: list[RankFailure]) -> None:
    if spec.failure_marker:
        print(root.to_marker(), file=sys.stderr, flush=True)
    else:
        print(format_report(root, len(failures), others=failures), file=sys.stderr, flush=True)
