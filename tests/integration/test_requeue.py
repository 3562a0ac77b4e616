"""A job from ``ringtrain script slurm --requeue`` on the real 2-node Slurm: warned, requeued, resumed.

The trial itself (what is sent, what is waited for, what is checked) is in
tests/integration/requeue_trials.py; benchmarks/requeue_trials.py runs N of them for the acceptance figure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.requeue_trials import run_trial
from tests.integration.slurm import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_warned_job_snapshots_requeues_itself_and_resumes_to_the_same_final_step(
        slurm_two_nodes: SlurmCluster, tmp_path: Path) -> None:
    trial = run_trial(slurm_two_nodes, tmp_path / "trial")
    assert trial.passed, trial.problem
    # the requeued job went on from the very step the warned one stopped at
    assert trial.preempted_step is not None
    assert trial.resumed_step == trial.preempted_step
