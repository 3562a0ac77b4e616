"""``--max-restarts`` recovers from a rank SIGKILLed at a random moment (issue 10): one trial of each kind.

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

import pytest

from tests.launch.restart_trials import KINDS, run_trial

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
