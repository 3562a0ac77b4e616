"""Failure agreement: one rank's error reaches every rank at the next agreed point, naming rank and errno."""

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from ringtrain.exceptions import SnapshotError
from ringtrain.train.agreement import RankFailedError, agreed, check_all, describe


class ThreadWorld:
    """``world_size`` threads standing in for ranks: ``sum`` is a real all-reduce between them."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=30)
        self._parts: list[torch.Tensor | None] = [None] * world_size
        self._total: torch.Tensor | None = None
        self.calls = 0

    def sum_fn(self, rank: int):
        def sum_(tensor: torch.Tensor) -> torch.Tensor:
            self._parts[rank] = tensor.clone()
            if self._barrier.wait() == 0:
                self._total = sum(p for p in self._parts)  # type: ignore[misc]
                self.calls += 1
            self._barrier.wait()
            return self._total.clone()  # type: ignore[union-attr]
        return sum_

    def run(self, body) -> list[BaseException | None]:
        outcome: list[BaseException | None] = [None] * self.world_size

        def one(rank: int) -> None:
            try:
                body(rank, self.sum_fn(rank))
            except BaseException as exc:  # noqa: BLE001 - the test looks at what each rank raised
                outcome[rank] = exc

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a rank is still waiting: the ranks did not agree"
        return outcome


def test_nothing_failed_costs_one_sum_and_raises_nowhere():
    world = ThreadWorld(3)

    def body(rank, sum_fn):
        with agreed(sum_fn, rank, 3, "writing"):
            pass

    assert world.run(body) == [None, None, None]
    assert world.calls == 1


def test_an_os_error_on_rank_0_reaches_every_rank_naming_the_rank_and_the_errno():
    world = ThreadWorld(3)
    full = OSError(errno.ENOSPC, "No space left on device", "/snaps/x.pt")

    def body(rank, sum_fn):
        with agreed(sum_fn, rank, 3, "writing snapshot /snaps/x.pt"):
            if rank == 0:
                raise full

    outcome = world.run(body)
    assert outcome[0] is full  # the failed rank raises its own error, traceback and all
    for rank in (1, 2):
        assert isinstance(outcome[rank], RankFailedError)
        assert outcome[rank].rank == 0
        text = str(outcome[rank])
        assert text.startswith("rank 0 failed writing snapshot /snaps/x.pt:")
        assert "ENOSPC" in text
        assert "No space left on device" in text


def test_a_snapshot_error_stays_a_snapshot_error_on_the_other_ranks():
    world = ThreadWorld(2)

    def body(rank, sum_fn):
        failure = None
        if rank == 1:
            try:
                raise PermissionError(errno.EACCES, "Permission denied")
            except PermissionError as exc:
                try:
                    raise SnapshotError("cannot write snapshot s.pt: Permission denied") from exc
                except SnapshotError as wrapped:
                    failure = wrapped
        check_all(sum_fn, rank, 2, "writing a snapshot", failure)

    outcome = world.run(body)
    assert isinstance(outcome[1], SnapshotError)
    assert type(outcome[0]) is SnapshotError
    assert "rank 1 failed writing a snapshot: [EACCES] cannot write snapshot s.pt" in str(outcome[0])


def test_the_lowest_failed_rank_is_named_when_several_fail():
    world = ThreadWorld(3)

    def body(rank, sum_fn):
        with agreed(sum_fn, rank, 3, "evaluating"):
            if rank:
                raise ValueError(f"bad batch on {rank}")

    outcome = world.run(body)
    assert "rank 1 failed evaluating: ValueError: bad batch on 1" in str(outcome[0])
    assert str(outcome[1]) == "bad batch on 1"
    assert str(outcome[2]) == "bad batch on 2"


def test_one_rank_raises_its_own_error_without_any_collective():
    with pytest.raises(OSError):
        check_all(lambda t: pytest.fail("no collective with one rank"), 0, 1, "x", OSError(errno.EIO, "io"))
    check_all(lambda t: pytest.fail("no collective with one rank"), 0, 1, "x", None)


def test_describe_names_the_errno_symbol_once():
    assert describe(OSError(errno.EISDIR, "Is a directory")) == "[EISDIR] [Errno 21] Is a directory"
    assert describe(SnapshotError("cannot write: No space left on device (ENOSPC)")).count("ENOSPC") == 1
    assert describe(KeyError("k")) == "KeyError: 'k'"


# --- end to end: `ringtrain train mnist -np 2` with a snapshot folder that cannot take the snapshot ---

TRAIN = [sys.executable, "-m", "ringtrain.cli.main", "train", "mnist", "-np", "2", "--subset", "1000",
         "--epochs", "1", "--batch-size", "32", "--save-every-steps", "10", "--no-progress", "--threads", "1"]
#: The bound the issue sets from one rank's failure to every rank out (it used to be 8 minutes).
AGREED_WITHIN_S = 30.0


def _run_until_failure(argv: list[str]) -> tuple[int, str, float]:
    """Run ``argv``; the exit code, stderr, and seconds from the root-cause report (where a rank's error
    is told, once) to the launcher's exit."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines, failed_at = [], None
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends when every process holding the pipe is gone
            lines.append(line)
            if failed_at is None and "Root cause" in line:
                failed_at = time.monotonic()
        proc.wait(timeout=AGREED_WITHIN_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = "".join(lines)
    assert failed_at is not None, err
    return proc.returncode, err, time.monotonic() - failed_at


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 64 KiB tmpfs: the check's probe file fits, a snapshot of the MNIST model does not."""
    folder = tmp_path / "full"
    folder.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {exc}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


def _assert_the_root_cause_is_rank_0s_snapshot_failure(err: str) -> None:
    """Rank 0's own error, or rank 1's naming it. Both ranks raise right after the same collective, and
    torch's agent reports the ranks it finds ended: when rank 1 ends first (a loaded machine), the agent
    stops rank 0 before it is seen failing, and rank 1's error is the report's root, naming rank 0's."""
    own = "  rank       : 0\n" in err and "  error      : cannot write snapshot" in err
    relayed = ("  rank       : 1\n" in err
               and "  error      : rank 0 failed writing a snapshot: cannot write snapshot" in err)
    assert own or relayed, err


def _rank_1s_also_lines(err: str, cause: str) -> list[str]:
    """The report's 'also' lines for rank 1, after asserting the one account of rank 1 that the agent's
    timing allows. torch's agent lists the ranks that had ended when it saw the first failure, then stops
    the rest: rank 1, which stops on rank 0's failure right after the same collective, is either the
    root naming rank 0's failure (it was seen first), or counted among the failed with its own 'also'
    line naming rank 0's failure and ``cause``, or stopped by the agent before it ended (no line)."""
    lines = err.splitlines()
    also = [line for line in lines if line.startswith("  also       : rank 1 ")]
    if "  rank       : 1\n" in err:  # rank 1 is the root: its error line names rank 0's failure
        assert not also, err
    elif "  (1 other rank(s) failed after it; every other rank was stopped.)" in lines:
        assert len(also) == 1, err
        assert "rank 0 failed writing a snapshot: cannot write snapshot" in also[0], err
        assert cause in also[0], err
    else:
        assert "  (every other rank was stopped.)" in lines, err
        assert not also, err
    return also


@pytest.mark.slow
def test_a_full_snapshot_folder_stops_every_rank_naming_enospc(full_tmpfs):
    code, err, seconds = _run_until_failure([*TRAIN, "--snapshot-dir", str(full_tmpfs)])
    assert code == 2, err
    _assert_the_root_cause_is_rank_0s_snapshot_failure(err)
    assert "(ENOSPC)" in err
    # rank 1 stopped with it: its own line, where it wrote one before the agent stopped it, names rank
    # 0's failure and the cause (torch's agent stops the other ranks at the first failure it sees)
    also = _rank_1s_also_lines(err, "(ENOSPC)")
    for line in also:
        assert "rank 0 failed writing a snapshot: cannot write snapshot" in line
        assert "(ENOSPC)" in line
    assert err.count("cannot write snapshot") == 1 + len(also), err  # told once, not again at the end
    assert "ringtrain train: error: the ranks stopped on an error they reported" in err
    assert "Traceback" not in err
    assert seconds < AGREED_WITHIN_S, err


@pytest.mark.slow
def test_a_folder_named_like_the_next_snapshot_stops_every_rank_naming_eisdir(tmp_path):
    snaps = tmp_path / "snaps"
    (snaps / "snapshot-000000010.pt").mkdir(parents=True)
    code, err, seconds = _run_until_failure([*TRAIN, "--snapshot-dir", str(snaps), "--no-resume"])
    assert code == 2, err
    _assert_the_root_cause_is_rank_0s_snapshot_failure(err)
    assert "(EISDIR)" in err
    for line in _rank_1s_also_lines(err, "(EISDIR)"):
        assert "rank 0 failed writing a snapshot" in line
    assert "Traceback" not in err
    assert seconds < AGREED_WITHIN_S, err
