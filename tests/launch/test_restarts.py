"""``--max-restarts`` recovers from a rank SIGKILLed at a random moment (issue 10): one trial of each kind;
a job that recovered keeps the failure's traceback in its "earlier attempts" section.

Each trial (see :mod:`tests.launch.restart_trials`) checks exit 0, one restart announced naming the
killed rank, a resume from a snapshot at least as new as the newest one at the kill, and the right
final epoch and step count. One trial per kind keeps the full suite (CI) within its time; every
trial makes every check. More trials are for acceptance runs: ``RINGTRAIN_RESTART_TRIALS=3 python -m
pytest tests/launch/test_restarts.py`` runs 3 of each here, and ``python -m tests.launch.restart_trials
--trials 10`` runs the acceptance's 10 of each (CONTRIBUTING.md).
"""

from __future__ import annotations

import os
import random
import sys

import pytest

from ringtrain.launch.agent import NodeSpec, run_node
from tests.launch.restart_trials import KINDS, run_trial
from tests.ranks import free_port

pytestmark = pytest.mark.slow


def trial_count() -> int:
    """Trials per kind: 1, or ``RINGTRAIN_RESTART_TRIALS`` for an acceptance run."""
    text = os.environ.get("RINGTRAIN_RESTART_TRIALS", "1")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"RINGTRAIN_RESTART_TRIALS={text!r} is not a positive whole number; "
                         "unset it for one trial per kind, or set e.g. 3")
    return int(text)


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_rank_is_recovered_in_every_trial(kind, tmp_path):
    rng = random.Random()
    trials = trial_count()
    for n in range(trials):
        folder = tmp_path / str(n)
        folder.mkdir()
        trial = run_trial(kind, folder, rng)
        assert trial.ok, (f"trial {n + 1} of {trials} of {kind} (killed rank {trial.killed_rank} after "
                          f"snapshot {trial.newest_at_kill}): {trial.problems}\n{trial.log[-6000:]}")


FLAKY = """
import os

def load_batch():
    if os.environ["RINGTRAIN_ATTEMPT"] == "0" and os.environ["RANK"] == "1":
        raise RuntimeError("flaky storage on the first attempt")

load_batch()
print("rank", os.environ["RANK"], "trained")
"""


@pytest.mark.slow
def test_a_job_that_recovered_ends_with_the_traceback_of_the_failure_it_recovered_from(tmp_path, capfd):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    node = NodeSpec(nproc=2, rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_timeout=60.0, max_restarts=1,
                    env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    assert run_node(node, [sys.executable, str(script)]) == 0
    err = capfd.readouterr().err
    section = err[err.index("ringtrain run: the job finished after 1 restart(s); earlier attempts:"):]
    assert "  attempt 0 ended " in section
    assert ": rank 1 on " in section
    assert "(RuntimeError: flaky storage on the first attempt)" in section
    assert "    Traceback (most recent call last):" in section
    assert 'raise RuntimeError("flaky storage on the first attempt")' in section  # the user's frame
    assert "Root cause" not in err  # the job did not fail
