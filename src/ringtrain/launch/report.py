"""The root-cause report: the first rank that failed, told once, with host, exit status and traceback.

A per-host agent started by a multi-host driver does not print the report itself: it writes one
marker line (``RINGTRAIN_FAILURE`` + JSON) on stderr, and the driver picks the earliest failure of
all hosts and prints that one.

A job that failed and recovered by a restart (``--max-restarts``) ends with a short "earlier attempts"
section instead (:func:`format_earlier_attempts`): the ranks' log files go with the job, and the
traceback of the failure it recovered from would be lost with them.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

MARKER = "@@RINGTRAIN_FAILURE@@ "
#: A rank's status after it stopped on request with its snapshot written (the Trainer's; sysexits'
#: EX_TEMPFAIL, "try again later"). ``ringtrain run`` exits with it when its ranks did.
PREEMPTED_EXIT = 75

#: Words in an error that mean the rank asked for a GPU (CUDA tensors, NCCL, the NVIDIA driver).
_GPU_WORDS = re.compile(r"cuda|nccl|nvidia|\bgpus?\b", re.IGNORECASE)

#: Words in an error that mean the rank failed because another one failed first or went away (gloo's
#: and NCCL's transports; ringtrain's control plane, heartbeats and aborted waits; a node's agent that
#: lost node 0 once node 0 gave up after its own rank failed): a consequence, not a cause.
_CONSEQUENCE_WORDS = re.compile(r"closed by peer|reset by peer|broken pipe|remote process exited|"
                                r"\(it exited or failed\)|: it exited or failed|failed during a transfer|"
                                r"exited: its connection is closed|has given no sign of life for|"
                                r"has failed: .* heard no heartbeat|was abandoned: |"
                                r"lost node \d+, which hosts the rendezvous",
                                re.IGNORECASE)
#: The first words of ringtrain's engine's ``SHUT_DOWN_MESSAGE`` (ringtrain.engine.background): every
#: rank's pending and later collectives fail with it once any rank stops the engine (it failed and its
#: interpreter exited, or a peer was declared failed). Not imported from there: the engine needs torch.
SHUT_DOWN_WORDS = "Horovod has been shut down."
#: What the engine adds to its shut-down message when the shut-down was this rank's own finding: a stall
#: it detected, or a collective that failed here (that one is a consequence only when its detail names a
#: peer that went away, which :data:`_CONSEQUENCE_WORDS` finds).
_OWN_SHUT_DOWN = re.compile(r"\(stall: |: a collective failed: ")


@dataclass(frozen=True)
class RankFailure:
    """One failed worker process."""

    host: str
    rank: int
    local_rank: int
    exitcode: int
    pid: int
    time: float
    message: str = ""
    traceback: str = ""
    output_tail: str = ""
    hint: str = ""
    """What to do about it, when the cause is known (``HINT: ...``)."""
    #: How it ended when the exit code does not say it (a host the launcher lost contact with).
    state: str = ""
    history: tuple[str, ...] = ()
    """One line per restart of the job before it gave up (``--max-restarts``), oldest first."""

    def status(self) -> str:
        """``exit code 3`` or ``signal SIGKILL`` (negative exit codes are signals)."""
        if self.state:
            return self.state
        if self.exitcode < 0:
            try:
                name = signal.Signals(-self.exitcode).name
            except ValueError:
                name = f"signal {-self.exitcode}"
            return f"killed by {name}"
        return f"exit code {self.exitcode}"

    def to_marker(self) -> str:
        """One line for the driver."""
        return MARKER + json.dumps(asdict(self))

    @classmethod
    def from_marker(cls, line: str) -> RankFailure | None:
        """Parse a marker line; None for any other line."""
        if not line.startswith(MARKER):
            return None
        try:
            body = json.loads(line[len(MARKER):])
            body["history"] = tuple(body.get("history", ()))
            return cls(**body)
        except (ValueError, TypeError, AttributeError):
            return None


def asks_for_gpu(failure: RankFailure) -> bool:
    """Whether the rank's error (or, without one, its last line of output) is about CUDA, NCCL or a GPU."""
    last_line = (failure.output_tail.strip().splitlines() or [""])[-1]
    return bool(_GPU_WORDS.search(failure.message or last_line))


def no_gpu_hint(host: str) -> str:
    """The hint for a rank that asked for CUDA or NCCL on a host where torch sees no CUDA device."""
    return (f"no CUDA device is visible here (host {host}: torch.cuda.is_available() is False), but the "
            "rank asked for CUDA or NCCL. HINT: on CPU use the gloo backend and CPU tensors (ringtrain train "
            "--device cpu; drop .cuda() and torch.cuda.set_device; init_process_group('gloo')), or run on a "
            "host with a GPU and a CUDA build of torch.")


def earliest(failures: Iterable[RankFailure]) -> RankFailure | None:
    """The root cause: the failure that happened first (ties keep the order of arrival).

    Ranks ended by SIGTERM without an error of their own were stopped by their agent because another
    rank failed, so they come last (:func:`stopped_by_its_agent`). One ended by SIGTERM that left an
    error of its own failed of its own accord first and was stopped while it exited (the agent stops
    every rank once one has exited): it takes part like any failure, by its own exact time. A rank that
    left no error file is timed by torch's agent to the whole second only, so within one second a rank
    that said why it failed (its own, exact time) comes first, unless what it said is that it failed
    because of another rank (a peer went away, or the engine shut down once another rank stopped it:
    :func:`because_of_another_rank`): such a rank comes after every other within its second.
    """
    ordered = sorted(enumerate(failures),
                     key=lambda item: (stopped_by_its_agent(item[1]), int(item[1].time),
                                       failed_because_of_another_rank(item[1]), not item[1].message,
                                       item[1].time, item[0]))
    return ordered[0][1] if ordered else None


def stopped_by_its_agent(failure: RankFailure) -> bool:
    """Whether the rank ended by SIGTERM without an error of its own: it left no error message, or one
    that says it failed because of another rank. A rank that left an error of its own had failed before
    the signal came."""
    return failure.exitcode == -signal.SIGTERM and (not failure.message
                                                     or because_of_another_rank(failure.message))


def because_of_another_rank(message: str) -> bool:
    """Whether an error message (``Type: text``) says that the rank failed because another rank failed
    first: its connection to a peer closed or broke, a peer was declared failed, or ringtrain's engine
    was shut down under it (``HorovodInternalError: Horovod has been shut down. ...``), unless the
    shut-down was this rank's own finding (a stall, a collective that failed here for its own reason).
    Any other error, a ``HorovodInternalError`` about mismatched requests among them, is a cause."""
    if _CONSEQUENCE_WORDS.search(message):
        return True
    at = message.find(SHUT_DOWN_WORDS)
    return at >= 0 and not _OWN_SHUT_DOWN.search(message, at)


def failed_because_of_another_rank(failure: RankFailure) -> bool:
    """Whether the rank's error says that it failed because another rank failed first."""
    return bool(failure.message) and because_of_another_rank(failure.message)


def format_report(root: RankFailure, total_failed: int = 1, world_size: int | None = None,
                  others: Sequence[RankFailure] = ()) -> str:
    """The text printed once when a job fails; ``others``: the other failed ranks, of which those that
    said why they stopped (in other words than the root's) get a line each."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(root.time))
    after = f" after {len(root.history) - 1} restart(s)" if len(root.history) > 1 else ""
    status = root.status()
    if not stopped_by_its_agent(root) and root.exitcode == -signal.SIGTERM and not root.state:
        # it failed of its own accord and was stopped by its agent as it exited
        status += " (while exiting after the error below)"
    lines = [
        f"ringtrain run: job failed{after}. Root cause (first rank to fail):",
        f"  host       : {root.host}",
        f"  rank       : {root.rank}" + (f" of {world_size}" if world_size else "")
        if root.rank >= 0 else "  rank       : none (the node's agent failed before or outside its ranks)",
        f"  local rank : {root.local_rank}" if root.local_rank >= 0 else "  local rank : -",
        f"  status     : {status}",
        f"  pid        : {root.pid}",
        f"  time       : {when}",
    ]
    if root.message:
        lines.append(f"  error      : {root.message}")
    detail = root.traceback or root.output_tail
    if detail:
        lines.append("  traceback  :" if root.traceback else "  last output:")
        lines.extend("    " + line for line in detail.rstrip().splitlines())
    if root.hint:
        lines.append(f"  hint       : {root.hint}")
    if root.history:
        lines.append("  attempts   :")
        lines.extend("    " + line for line in root.history)
    told = [other for other in others
            if other is not root and other.message and other.message != root.message]
    lines.extend(f"  also       : {describe(other)}" for other in told)
    # a rank its agent stopped (SIGTERM, no error of its own) did not fail: it was stopped
    stopped = sum(1 for other in others if other is not root and stopped_by_its_agent(other))
    failed_after = total_failed - 1 - stopped
    if failed_after > 0:
        lines.append(f"  ({failed_after} other rank(s) failed after it; every other rank was stopped.)")
    else:
        lines.append("  (every other rank was stopped.)")
    return "\n".join(lines)


#: Lines of a traceback (or of a rank's last output) that the "earlier attempts" section keeps.
EARLIER_ATTEMPT_LINES = 15


def describe(failure: RankFailure) -> str:
    """``rank 1 on node2 exit code 1 (RuntimeError: boom)``: one failure in one line."""
    text = f"rank {failure.rank} on {failure.host} {failure.status()}"
    return f"{text} ({failure.message})" if failure.message else text


def _last_lines(text: str, keep: int) -> list[str]:
    lines = text.rstrip().splitlines()
    if len(lines) <= keep:
        return lines
    # the head of a Python traceback says what it is; its tail says where and why
    head = lines[:1] if lines[0].startswith("Traceback") else []
    tail = lines[-max(keep - len(head) - 1, 1):]
    return [*head, f"  ... ({len(lines) - len(head) - len(tail)} line(s) left out)", *tail]


def format_earlier_attempts(attempts: Sequence[tuple[int, float, Sequence[RankFailure]]],
                            keep: int = EARLIER_ATTEMPT_LINES) -> str:
    """The section printed when a job finished after restarts: each failed attempt's first failure,
    with the end of its traceback (or of its last output).

    ``attempts``: (attempt, when it ended, this node's failed ranks; none when another node's failure
    restarted it), oldest first.
    """
    lines = [f"ringtrain run: the job finished after {len(attempts)} restart(s); earlier attempts:"]
    for attempt, when, failures in attempts:
        at = time.strftime("%H:%M:%S", time.localtime(when))
        first = earliest(failures)
        if first is None:
            lines.append(f"  attempt {attempt} ended {at}: another node restarted its ranks")
            continue
        others = f" ({len(failures) - 1} other rank(s) ended after it)" if len(failures) > 1 else ""
        lines.append(f"  attempt {attempt} ended {at}: {describe(first)}{others}")
        detail = first.traceback or first.output_tail
        if detail:
            lines.extend("    " + line for line in _last_lines(detail, keep))
        if first.hint:
            lines.append(f"    hint: {first.hint}")
    return "\n".join(lines)


def preempted(failures: list[RankFailure]) -> bool:
    """The ranks stopped on request, resumably: one exited with :data:`PREEMPTED_EXIT` (the Trainer's
    status once every rank agreed and the snapshot is on disk) and every other either did too or was
    stopped by SIGTERM as it ended (as a signal, or as a shell's 128 + 15). Which ended first does not
    matter, and failure times are whole seconds, too coarse to tell."""
    codes = [f.exitcode for f in failures]
    return PREEMPTED_EXIT in codes and all(
        code in (PREEMPTED_EXIT, -signal.SIGTERM, 128 + signal.SIGTERM) for code in codes)


def preempted_line(who: str) -> str:
    """What a launcher says when its ranks (``who``: "2 rank(s)") stopped with :data:`PREEMPTED_EXIT`."""
    return (f"{who} stopped on request with exit status {PREEMPTED_EXIT} (preempted: a snapshot was "
            "written where they save one); the job can be resumed by running it again.")
