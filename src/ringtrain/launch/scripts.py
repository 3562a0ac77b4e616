"""Job scripts: a ready ``sbatch`` / ``qsub`` / ``bsub`` file that runs a command through ``ringtrain run``.

Every script starts one ``ringtrain run`` agent per node, each starting that node's ranks, and lets the
nodes meet at the first host of the job (its address is taken inside the job: ``scontrol show
hostnames``, ``$PBS_NODEFILE``, ``$LSB_DJOB_HOSTFILE``), on a port picked free there when the job starts
(every scheduler runs the batch script on that first host): two jobs sharing a node never collide, as
ports derived from job numbers can. Slurm: ``srun`` starts the agents (one task per node, with the
task's CPUs passed on to ``srun``, which Slurm 22.05 and later no longer do by themselves). PBS:
``pbsdsh`` starts them, one on each host, so the ranks run under PBS's control (its accounting, limits
and clean-up) and need no ssh. LSF: the script runs one ``ringtrain run`` on the first host, which reads
the job's host file and reaches the other hosts over ssh.

CPUs: ``--cpus-per-proc C`` reserves C cores per rank; without it the job takes whole nodes and each
rank gets the node's cores divided by its ranks, read in the job (``SLURM_CPUS_ON_NODE``, else the
cores ``nproc`` counts on the node). ``OMP_NUM_THREADS`` is exported either way.

The interpreter is ``python3`` as the job finds it (after ``--venv`` or ``--setup`` lines), or
``--python``: never this machine's absolute path, which a cluster's nodes need not have.

``--requeue``: the job asks for the scheduler's warning signal ``--signal-before`` seconds before its end
and is marked rerunnable; the launch runs in the background so that the batch shell can take the warning
and pass it on to the ranks, and when ``ringtrain run`` ends with the preemption status (75: every rank
stopped after the same step and wrote its snapshot, docs/preemption.md) the script requeues its own job
(``scontrol requeue``, ``qrerun``, ``brequeue``) and exits 0; any other status is the job's. The requeued
job runs the same command, which resumes from the snapshot folder: a relative one lies in the job's
working folder, the same for every run of the job.

Pure functions: a :class:`JobScript` in, the script's text out.
"""

from __future__ import annotations

import math
import re
import shlex
import textwrap
from dataclasses import dataclass, field

from ringtrain.engine.auth import export_secret_line
from ringtrain.launch.report import PREEMPTED_EXIT
from ringtrain.launch.requeue import REQUEUE_COMMANDS

#: Scheduler names accepted by :func:`render`.
SCHEDULERS = ("slurm", "pbs", "lsf")
#: The one wall-time format: hours (any number of digits), minutes and seconds below 60.
_TIME = re.compile(r"^(\d+):([0-5]\d):([0-5]\d)$")
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_WORD = re.compile(r"^[A-Za-z0-9_.@+-]+$")
#: ``--mail-type`` words: when to send mail.
MAIL_EVENTS = ("begin", "end", "fail", "all")
_RANKS_PER_NODE = "--nproc-per-node"
#: Default seconds between the scheduler's warning signal and the job's end (``--signal-before``).
SIGNAL_BEFORE_S = 120


def parse_walltime(text: str) -> int:
    """``HH:MM:SS`` -> seconds; anything else is a ValueError that names the value and the fix."""
    match = _TIME.match(text.strip())
    hours, minutes, seconds = (int(g) for g in match.groups()) if match else (0, 0, 0)
    if not hours * 3600 + minutes * 60 + seconds:
        raise ValueError(f"--time {text!r} is not a wall time in HH:MM:SS (hours, then minutes and "
                         "seconds below 60, more than zero). HINT: write e.g. --time 01:30:00 for an hour "
                         "and a half, --time 48:00:00 for two days.")
    return hours * 3600 + minutes * 60 + seconds


def _hms(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


@dataclass(frozen=True, kw_only=True)
class JobScript:
    """What the job needs; validated on construction (``ValueError`` naming the bad value and the fix)."""

    scheduler: str
    """``slurm``, ``pbs`` or ``lsf``."""
    nodes: int
    """Number of nodes."""
    procs_per_node: int
    """Ranks per node (``ringtrain run --nproc-per-node``)."""
    command: tuple[str, ...]
    """The program and its arguments, run by every rank."""
    time: str | None = None
    """Wall-clock limit, ``HH:MM:SS`` (converted to each scheduler's own form)."""
    queue: str | None = None
    """Slurm partition, PBS or LSF queue."""
    qos: str | None = None
    """Slurm quality of service (Slurm only)."""
    account: str | None = None
    """Account to charge (Slurm ``--account``, PBS ``-A``, LSF project ``-P``)."""
    mail_user: str | None = None
    """Address for the scheduler's mails."""
    mail_type: tuple[str, ...] = ()
    """When to mail: words of :data:`MAIL_EVENTS` (default with a ``mail_user``: end and fail)."""
    job_name: str = "ringtrain"
    """Job name shown by ``squeue`` / ``qstat`` / ``bjobs``."""
    output: str | None = None
    """Output file (default: Slurm ``ringtrain-%j.out``, LSF ``ringtrain-%J.out``, PBS its own)."""
    cpus_per_proc: int | None = None
    """CPU cores reserved per rank (also each rank's ``OMP_NUM_THREADS``); None: whole nodes, each rank
    the node's cores divided by ``procs_per_node``, as the job finds them."""
    gpus_per_node: int = 0
    """GPUs per node (0: none requested); rank r of a node uses its GPU ``LOCAL_RANK``."""
    python: str = "python3"
    """Interpreter with ringtrain, as the job finds it; the script runs ``PYTHON -m ringtrain run``."""
    setup: tuple[str, ...] = field(default_factory=tuple)
    """Shell lines run before the launch (``module load ...``, ``source venv/bin/activate``)."""
    pbs_resources: str = "select"
    """PBS resource syntax: ``select`` (PBS Pro/OpenPBS) or ``nodes`` (Torque ``nodes=N:ppn=M``)."""
    requeue: bool = False
    """Ask for the warning signal, mark the job rerunnable, and requeue it when ``ringtrain run`` ends with
    the preemption status (75)."""
    signal_before: int = SIGNAL_BEFORE_S
    """With ``requeue``: seconds before the job's end at which the scheduler sends its warning signal."""

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}. "
                             f"HINT: use one of {', '.join(SCHEDULERS)}.")
        self._check_sizes()
        if not self.command:
            raise ValueError("no command to run. HINT: put it after --, e.g. "
                             "ringtrain script slurm --nodes 2 --nproc-per-node 4 -- python train.py")
        if self.time is not None:
            parse_walltime(self.time)
        self._check_names()
        if self.pbs_resources not in ("select", "nodes"):
            raise ValueError(f"--pbs-resources {self.pbs_resources!r} is unknown. HINT: use select "
                             "(PBS Pro, OpenPBS) or nodes (Torque).")
        for line in self.setup:
            if "\n" in line:
                raise ValueError(f"--setup {line!r} spans several lines. HINT: repeat --setup once per line.")
        if self.requeue:
            self._check_requeue()

    def _check_sizes(self) -> None:
        for name in ("nodes", "procs_per_node", "cpus_per_proc"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(self, name)} must be at least 1. HINT: e.g. {flag} 2.")
        if self.gpus_per_node < 0:
            raise ValueError(f"--gpus-per-node {self.gpus_per_node} is negative. HINT: use 0 for none.")

    def _check_names(self) -> None:
        """The words that go into the script as they are: job name, queue, QOS, account, mail."""
        if not _NAME.match(self.job_name):
            raise ValueError(f"--job-name {self.job_name!r} must be 1-64 letters, digits or . _ + -. "
                             "HINT: e.g. --job-name mnist-ddp.")
        queue_flag = "--queue" if self.scheduler != "slurm" else "--partition"
        for flag, value in ((queue_flag, self.queue), ("--qos", self.qos), ("--account", self.account),
                            ("--mail-user", self.mail_user)):
            if value is not None and not _WORD.match(value):
                raise ValueError(f"{flag} {value!r} holds characters a job script cannot carry safely. "
                                 f"HINT: give the plain name, e.g. {flag} gpu.")
        if self.qos is not None and self.scheduler != "slurm":
            raise ValueError(f"--qos {self.qos!r}: {self.scheduler.upper()} has no QOS. HINT: choose a queue "
                             "with --queue instead.")
        unknown = [word for word in self.mail_type if word not in MAIL_EVENTS]
        if unknown:
            raise ValueError(f"--mail-type {','.join(self.mail_type)!r}: {unknown[0]!r} is not one of "
                             f"{', '.join(MAIL_EVENTS)}. HINT: e.g. --mail-type end,fail.")

    def _check_requeue(self) -> None:
        if self.signal_before < 1:
            raise ValueError(f"--signal-before {self.signal_before} must be at least 1 (seconds before the "
                             "job's end). HINT: e.g. --signal-before 120.")
        if self.walltime is not None and self.signal_before >= self.walltime:
            raise ValueError(f"--signal-before {self.signal_before} is not shorter than --time {self.time}: "
                             "the warning would come before the job starts. HINT: give a longer --time or a "
                             "shorter --signal-before.")
        train = _ringtrain_train_args(self.command)
        if train is None:
            return  # another program: its snapshot folder is its own business (docs/preemption.md)
        if "--no-resume" in train:
            raise ValueError("--requeue with `ringtrain train --no-resume`: every requeued run would start "
                             "afresh. HINT: leave out --no-resume.")
        if not any(arg.startswith(("--snapshot-dir", "--save-every")) for arg in train):
            raise ValueError("--requeue: the command `ringtrain train` writes no snapshot, so a requeued job "
                             "would start afresh. HINT: add --snapshot-dir DIR (a folder every node and "
                             "every run of the job sees) to the command.")

    @property
    def cpus_per_node(self) -> int | None:
        """CPU cores of one node's share of the job (None: the whole node)."""
        return None if self.cpus_per_proc is None else self.procs_per_node * self.cpus_per_proc

    @property
    def walltime(self) -> int | None:
        """The wall-clock limit in seconds (None: the scheduler's default)."""
        return None if self.time is None else parse_walltime(self.time)

    @property
    def mail_events(self) -> tuple[str, ...]:
        """When to mail, with ``all`` spelled out; end and fail when only an address was given."""
        events = self.mail_type or (("end", "fail") if self.mail_user else ())
        return ("begin", "end", "fail") if "all" in events else tuple(dict.fromkeys(events))


def _ringtrain_train_args(command: tuple[str, ...]) -> tuple[str, ...] | None:
    """The arguments after ``ringtrain train`` (or ``python -m ringtrain train``) in ``command``; None
    when the command is another program."""
    for k, arg in enumerate(command[:-1]):
        if arg.rsplit("/", 1)[-1] == "ringtrain" and command[k + 1] == "train":
            return command[k + 2:]
    return None


# --- the parts every script shares ------------------------------------------------------------------

#: Python that prints a port the kernel holds free on this host (the batch script runs on node 0).
_FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'


def _job_environment(job: JobScript, head_node: str) -> list[str]:
    """The variables every node of the job gets, exported by the script before the launch.

    This is the one place for job-wide variables: node 0's address and port (picked free at run time on
    node 0, where every scheduler runs the batch script), threads per rank, and the per-job secret
    (``export RINGTRAIN_JOB_SECRET=...``): the nodes start their ranks separately and prove it to each
    other (docs/security.md). PBS's threads are set on each node, in its node script.
    """
    lines = ["# Node 0 of the job hosts the rendezvous, on a port free there now: the batch script runs on",
             "# node 0, and one the kernel hands out is in use by no other job (a port derived from the",
             "# job number could be: two jobs sharing a node would collide).",
             f"MASTER_ADDR=$({head_node})",
             "export MASTER_ADDR",
             f"MASTER_PORT=$({shlex.quote(job.python)} -c {shlex.quote(_FREE_PORT)})",
             "export MASTER_PORT"]
    lines += ["# The nodes prove this per-job secret to each other (a fresh one unless one is exported).",
              export_secret_line(job.python)]
    if job.scheduler == "slurm":
        lines += _threads_lines(job, "SLURM_CPUS_ON_NODE")
    elif job.scheduler == "lsf":
        lines += _threads_lines(job, "$(nproc)")
    return lines


def _threads_lines(job: JobScript, cores: str) -> list[str]:
    """``OMP_NUM_THREADS`` for every rank: ``--cpus-per-proc``, else the node's ``cores`` shared out."""
    if job.cpus_per_proc is not None:
        return [f"export OMP_NUM_THREADS={job.cpus_per_proc}  # --cpus-per-proc cores for each rank"]
    share = f"{cores} / {job.procs_per_node}"
    return ["# The node's cores shared among its ranks (--cpus-per-proc sets a number instead).",
            f"export OMP_NUM_THREADS=$(( {share} > 1 ? {share} : 1 ))"]


def _interpreter_check(job: JobScript) -> list[str]:
    python = shlex.quote(job.python)
    return [f"if ! {python} -c 'import ringtrain' 2>/dev/null; then",
            f'    echo "job: {job.python} ($(command -v {python} || echo not found)) cannot import '
            'ringtrain: activate its environment (ringtrain script --venv DIR, --setup LINE) or name the '
            'interpreter (--python)" >&2',
            "    exit 2",
            "fi"]


def _launch_line(job: JobScript, node_flags: str = "") -> str:
    run = [job.python, "-m", "ringtrain", "run", _RANKS_PER_NODE, str(job.procs_per_node)]
    return (shlex.join(run) + node_flags + ' --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" '
            + shlex.join(job.command))


def _body(job: JobScript, preamble: list[str], head_node: str, launch: list[str]) -> list[str]:
    # -u only after the setup lines: `module load` and some activate scripts read unset variables.
    return ["", *preamble, "set -eo pipefail", *job.setup, "set -u", *_interpreter_check(job),
            *_job_environment(job, head_node), "", *launch, ""]


def _background_launch(job: JobScript, launch: list[str], warning: str, how: str) -> list[str]:
    """``launch`` in the background, with a trap that passes the scheduler's ``warning`` signal on to it.

    A foreground command would hold the trap until it ended (bash runs traps between commands), so the
    launch runs in the background and the shell waits for it, then :func:`_requeue_tail`.
    """
    return [*textwrap.wrap(f"--requeue: {how}", 100, initial_indent="# ", subsequent_indent="# "),
            "# The launch runs in the background: bash runs a trap only between commands, and the warning",
            "# must reach the ranks while they run. One that comes before the launch has started is passed",
            "# on as soon as it has.",
            'LAUNCH_PID=""',
            "WARNED=0",
            f'warn_ranks() {{ WARNED=1; [ -z "$LAUNCH_PID" ] || kill -{warning} "$LAUNCH_PID" 2>/dev/null '
            "|| true; }",
            f"trap 'echo \"job: SIG{warning}: the ranks snapshot and stop\" >&2; warn_ranks' {warning}",
            *launch[:-1], launch[-1] + " &",
            "LAUNCH_PID=$!",
            '[ "$WARNED" = 0 ] || warn_ranks',
            "status=0",
            "# wait returns early for each trapped signal: wait again while the launch runs, then take its",
            "# status",
            'while kill -0 "$LAUNCH_PID" 2>/dev/null; do wait "$LAUNCH_PID" || true; done',
            'wait "$LAUNCH_PID" || status=$?',
            *_requeue_tail(job)]


def _requeue_tail(job: JobScript) -> list[str]:
    """Requeue the job when the launch ended preempted (every rank's snapshot written), else pass on."""
    command, variable = REQUEUE_COMMANDS[job.scheduler]
    return [f'if [ "$status" -eq {PREEMPTED_EXIT} ]; then',
            f'    echo "job: ringtrain run ended preempted (status {PREEMPTED_EXIT}, every rank stopped '
            f'after the same step and the snapshot is written): requeueing job ${variable}; it resumes from '
            'the snapshot" >&2',
            f'    if ! {command} "${variable}"; then',
            f'        echo "job: {command} ${variable} failed: submit the same script again to resume from '
            'the snapshot" >&2',
            f'        exit {PREEMPTED_EXIT}',
            "    fi",
            "    exit 0  # requeued: not a failure",
            "fi",
            'exit "$status"']


# --- one function per scheduler --------------------------------------------------------------------

def slurm_script(job: JobScript) -> str:
    """An ``sbatch`` script: one ``ringtrain run`` per node via ``srun``, each starting the node's ranks."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job.job_name}", f"#SBATCH --nodes={job.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if job.cpus_per_node is None:
        lines.append("#SBATCH --exclusive")  # whole nodes: every core for the node's ranks
    else:
        lines.append(f"#SBATCH --cpus-per-task={job.cpus_per_node}")
    if job.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={job.gpus_per_node}")
    if job.walltime is not None:
        days, rest = divmod(job.walltime, 86400)
        lines.append(f"#SBATCH --time={f'{days}-' if days else ''}{_hms(rest)}")
    if job.queue:
        lines.append(f"#SBATCH --partition={job.queue}")
    if job.qos:
        lines.append(f"#SBATCH --qos={job.qos}")
    if job.account:
        lines.append(f"#SBATCH --account={job.account}")
    if job.mail_user:
        lines.append(f"#SBATCH --mail-user={job.mail_user}")
    if job.mail_events:
        lines.append(f"#SBATCH --mail-type={','.join(e.upper() for e in job.mail_events)}")
    lines.append(f"#SBATCH --output={job.output or 'ringtrain-%j.out'}")
    if job.requeue:
        # B: only the batch shell gets the warning: its trap passes it to srun, which passes it to every
        # task (each node's ringtrain run, and with it the ranks). append: a requeued run's output follows
        # the first run's in the same file instead of replacing it.
        lines += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{job.signal_before}",
                  "#SBATCH --open-mode=append"]
    # srun is told the task's CPUs: since Slurm 22.05 it no longer takes them from the job's
    # --cpus-per-task, and all ranks of a node would share one core.
    cpus = "$SLURM_CPUS_PER_TASK" if job.cpus_per_node is not None else "$SLURM_CPUS_ON_NODE"
    # --kill-on-bad-exit: a node that fails takes the others down at once. Not with --requeue: the
    # nodes end preempted (75) one after another, and one killed while it ends would turn srun's
    # status into 143, so the job would not be requeued; ringtrain's own failure detection still ends
    # the other nodes' ranks when one fails (docs/failures.md).
    srun = [f'srun --ntasks-per-node=1 --cpus-per-task="{cpus}"'
            + ("" if job.requeue else " --kill-on-bad-exit=1")]
    if job.gpus_per_node:
        srun[0] += " --gpu-bind=none"  # the node's one task owns all its GPUs; rank r takes GPU r
    launch = [srun[0] + " \\", "    " + _launch_line(job)]
    if job.requeue:
        launch = _background_launch(job, launch, "USR1", f"Slurm sends SIGUSR1 to this shell "
                                    f"{job.signal_before} s before the time limit (--signal=B:USR1@...); "
                                    "srun passes it to every task.")
    preamble = [f"# {job.nodes} node(s) x {job.procs_per_node} rank(s): srun starts one `ringtrain run` per "
                "node,", "# which starts that node's ranks; the nodes meet at the job's first host."]
    head = 'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p'
    return "\n".join(lines + _body(job, preamble, head, launch))


def pbs_script(job: JobScript) -> str:
    """A ``qsub`` script: one ``ringtrain run`` that spreads the ranks over ``$PBS_NODEFILE``'s hosts."""
    cpus = job.cpus_per_node or job.procs_per_node  # whole nodes: at least a core per rank, and excl
    if job.pbs_resources == "select":
        resources = f"select={job.nodes}:ncpus={cpus}:mpiprocs={job.procs_per_node}"
        if job.gpus_per_node:
            resources += f":ngpus={job.gpus_per_node}"
    else:
        resources = f"nodes={job.nodes}:ppn={cpus}"
        if job.gpus_per_node:
            resources += f":gpus={job.gpus_per_node}"
    lines = ["#!/bin/bash", f"#PBS -N {job.job_name}", f"#PBS -l {resources}"]
    if job.pbs_resources == "select":
        # one chunk per host: the ranks of a node stay together; excl: the whole host, all its cores
        lines.append("#PBS -l place=scatter" + (":excl" if job.cpus_per_node is None else ""))
    elif job.cpus_per_node is None:
        lines.append("#PBS -n")  # Torque: node-exclusive, all the host's cores for its ranks
    if job.walltime is not None:
        lines.append(f"#PBS -l walltime={_hms(job.walltime)}")
    if job.queue:
        lines.append(f"#PBS -q {job.queue}")
    if job.account:
        lines.append(f"#PBS -A {job.account}")
    if job.mail_user:
        lines.append(f"#PBS -M {job.mail_user}")
    if job.mail_events:
        letters = {"begin": "b", "end": "e", "fail": "a"}  # a: aborted
        lines.append("#PBS -m " + "".join(letters[e] for e in job.mail_events))
    if job.requeue:
        lines.append("#PBS -r y")  # rerunnable: qrerun may put it back in the queue
    lines.append("#PBS -j oe")
    if job.output:
        lines.append(f"#PBS -o {job.output}")
    preamble = [f"# {job.nodes} node(s) x {job.procs_per_node} rank(s): pbsdsh starts one `ringtrain run` on "
                "each host of",
                "# $PBS_NODEFILE, which starts that host's ranks; the hosts meet at the first.",
                'cd "$PBS_O_WORKDIR"']
    return "\n".join(lines + _body(job, preamble, 'sed -n 1p "$PBS_NODEFILE"', _pbs_launch(job)))


#: Ends the node script's text in the PBS job script (a quoted here-document: taken verbatim).
_NODE_SCRIPT_END = "RINGTRAIN_NODE_SCRIPT_END"


def _pbs_launch(job: JobScript) -> list[str]:
    """Start one ``ringtrain run`` per host through ``pbsdsh``: under PBS's control, no ssh.

    ``pbsdsh`` gives its tasks the job's environment, not this script's, so the job-wide variables
    travel in a node script that only the job's user can read (``mktemp``: mode 0600), in the job's
    working folder, which every host sees as it sees the environment's interpreter. The secret goes
    through ``printf``, a shell builtin: never on a command line that ``ps`` would show.
    """
    flags = ' --nnodes "$2" --node-rank "$1"'
    wait_lines = ['    wait "$pid" || status=$?']
    warning: list[str] = []
    if job.requeue:
        # PBS's warning is SIGTERM to every process of the job (at walltime, or when the job is
        # preempted), SIGKILL kill_delay later: the ranks take it themselves; this shell must only live
        # through it, and waits on until the pbsdsh tasks end (wait returns early for a trapped signal).
        warning = ["# --requeue: PBS sends SIGTERM to every process of the job at its walltime, SIGKILL "
                   "kill_delay later:",
                   "# the ranks snapshot and stop; this shell only notes it and waits for them.",
                   "trap 'echo \"job: SIGTERM: the ranks snapshot and stop\" >&2' TERM"]
        wait_lines = ['    while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done',
                      '    wait "$pid" || status=$?']
    node = ["set -eo pipefail", 'cd "$PBS_O_WORKDIR"  # pbsdsh starts its tasks in the home folder',
            *job.setup, "set -u", *_threads_lines(job, "$(nproc)"), "exec " + _launch_line(job, flags)]
    return [*warning,
            "if ! command -v pbsdsh >/dev/null; then",
            '    echo "job: pbsdsh not found: this script starts its ranks through PBS (PBS Pro, OpenPBS or '
            'Torque). HINT: submit it with qsub, or put PBS\'s bin folder on PATH with --setup" >&2',
            "    exit 2",
            "fi",
            "# pbsdsh passes the job's environment, not this script's: the node script carries the rest.",
            'NODE_SCRIPT=$(mktemp "$PBS_O_WORKDIR/.ringtrain-node-XXXXXX")',
            "trap 'rm -f \"$NODE_SCRIPT\"' EXIT",
            "{",
            "    printf 'export MASTER_ADDR=%q MASTER_PORT=%q RINGTRAIN_JOB_SECRET=%q\\n' \\",
            '        "$MASTER_ADDR" "$MASTER_PORT" "$RINGTRAIN_JOB_SECRET"',
            f"    cat <<'{_NODE_SCRIPT_END}'", *node, _NODE_SCRIPT_END,
            '} > "$NODE_SCRIPT"',
            "# One task on each host (pbsdsh -n: the index of the host's first line in $PBS_NODEFILE), its",
            "# node rank the host's place in the file; the job fails with a failed node's exit status.",
            "HOST_LINES=$(awk '!seen[$1]++ { print NR - 1 }' \"$PBS_NODEFILE\")",
            "NNODES=$(echo \"$HOST_LINES\" | wc -l)",
            "node_rank=0",
            "pids=()",
            "for index in $HOST_LINES; do",
            '    pbsdsh -n "$index" -- /bin/bash "$NODE_SCRIPT" "$node_rank" "$NNODES" &',
            "    pids+=($!)",
            "    node_rank=$((node_rank + 1))",
            "done",
            "status=0",
            'for pid in "${pids[@]}"; do',
            *wait_lines,
            "done",
            *(_requeue_tail(job) if job.requeue else ['exit "$status"'])]


def lsf_script(job: JobScript) -> str:
    """A ``bsub`` script: one ``ringtrain run`` that spreads the ranks over ``$LSB_DJOB_HOSTFILE``'s hosts.

    Classic LSF: ``-n`` slots with ``span[ptile=...]`` put each node's share on one host, and the
    script runs on the first of them. (On CSM systems where a separate launch node runs the script,
    start the ranks with ``jsrun`` instead.)
    """
    slots = job.cpus_per_node or 1  # whole hosts (-x): one slot each holds them
    lines = ["#!/bin/bash", f"#BSUB -J {job.job_name}", f"#BSUB -n {job.nodes * slots}",
             f'#BSUB -R "span[ptile={slots}]"']
    if job.cpus_per_node is None:
        lines.append("#BSUB -x")  # exclusive: all the host's cores for its ranks
    if job.gpus_per_node:
        lines.append(f'#BSUB -gpu "num={job.gpus_per_node}"')
    if job.walltime is not None:
        lines.append(f"#BSUB -W {_minutes(job.walltime)}")
    if job.queue:
        lines.append(f"#BSUB -q {job.queue}")
    if job.account:
        lines.append(f"#BSUB -P {job.account}")
    if job.mail_user:
        lines.append(f"#BSUB -u {job.mail_user}")
    if "begin" in job.mail_events:
        lines.append("#BSUB -B")
    if {"end", "fail"} & set(job.mail_events):
        lines.append("#BSUB -N")  # LSF mails one report when the job ends, however it ended
    lines.append(f"#BSUB -o {job.output or 'ringtrain-%J.out'}")
    if job.requeue:
        # -wa/-wt: SIGUSR1 that many minutes (rounded up) before the run limit; -r: rerunnable
        lines += ["#BSUB -r", "#BSUB -wa USR1", f"#BSUB -wt {_minutes(job.signal_before)}"]
    preamble = [f"# {job.nodes} node(s) x {job.procs_per_node} rank(s): `ringtrain run` reads the hosts from "
                "$LSB_DJOB_HOSTFILE", "# and starts each node's ranks (over ssh on the other nodes)."]
    launch = [_launch_line(job)]
    if job.requeue:
        launch = _background_launch(job, launch, "USR1", "LSF sends SIGUSR1 to the job "
                                    f"{_minutes(job.signal_before)} (hours:minutes) before its run limit "
                                    "(-wa, -wt); the trap passes it on.")
    return "\n".join(lines + _body(job, preamble, 'sed -n 1p "$LSB_DJOB_HOSTFILE"', launch))


def _minutes(seconds: int) -> str:
    """LSF's ``[hours:]minutes``, seconds rounded up."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def render(job: JobScript) -> str:
    """The job script for ``job.scheduler``."""
    return {"slurm": slurm_script, "pbs": pbs_script, "lsf": lsf_script}[job.scheduler](job)
