"""``--max-restarts`` recovers from a rank SIGKILLed at a random moment (issue 10): 3 trials of each kind.

Each trial (see :mod:`tests.launch.restart_trials`) checks exit 0, one restart announced naming the
killed rank, a resume from a snapshot at least as new as the newest one at the kill, and the right
final epoch and step count. ``python -m tests.launch.restart_trials --trials 10`` runs the
acceptance's 10 of each.
"""

from __future__ import annotations

import random

import pytest

from tests.launch.restart_trials import KINDS, run_trial

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_rank_is_recovered_in_three_of_three_trials(kind, tmp_path):
    rng = random.Random()
    for n in range(3):
        folder = tmp_path / str(n)
        folder.mkdir()
        trial = run_trial(kind, folder, rng)
        assert trial.ok, (f"trial {n + 1} of {kind} (killed rank {trial.killed_rank} after snapshot "
                          f"{trial.newest_at_kill}): {trial.problems}\n{trial.log[-6000:]}")
