"""Requeue acceptance: N jobs from ``ringtrain script slurm --requeue`` on a real 2-node Slurm, each warned.

Each trial (tests/integration/requeue_trials.py) submits a 2-node ``ringtrain train mnist`` job (one rank
on each of the namespace hosts hostA and hostB, their own slurmd each), sends the warning once the first
snapshot is on disk (``scancel --signal=USR1 --batch``, as Slurm's ``--signal=B:USR1@N``), and checks that
the ranks stopped at one step S with status 75, that the script requeued the job, that the requeued job
resumed from step S, and that it completed at the step count of an uninterrupted run. Slurm's hold of a
requeued job (about two minutes here, ``Reason=BeginTime``) is lifted by the trial with ``scontrol update
StartTime=now``; the times below are without it.

Needs root, Slurm's daemons, ``ip`` and ``sshd`` (as the integration tests)::

    sudo .venv/bin/python benchmarks/requeue_trials.py --trials 10

Results: ``benchmarks/results/requeue_trials_<cpu>_<date>-<time>.{md,json}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.integration: the namespace hosts and Slurm of the integration tests

from results_io import write_results  # noqa: E402
from tests.integration.netns import start_hosts  # noqa: E402
from tests.integration.requeue_trials import KINDS, STEPS, Trial, run_trial  # noqa: E402
from tests.integration.slurm import start_two_node_cluster  # noqa: E402


def _spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f})"
            if values else "-")


def report(trials: list[Trial], machine: dict[str, object], kind: str = "script") -> str:
    passed = [t for t in trials if t.passed]
    lines = [f"# Requeue trials: {len(passed)}/{len(trials)} passed",
             "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores (2-node Slurm of "
             "network-namespace hosts on this one machine).",
             ("Job: `ringtrain script slurm -N 2 --nproc-per-node 1 --requeue`" if kind == "script" else
              "Job: a batch script of its own (`#SBATCH --nodes=2 --requeue --signal=USR1@120`) with "
              "`ringtrain run --requeue --nproc-per-node 1`")
             + f" running `ringtrain train mnist --epochs 1 --max-steps-per-epoch {STEPS} --save-every-steps "
             f"5`; warning sent by `scancel --signal=USR1{' --batch' if kind == 'script' else ''}` once the "
             "first snapshot was on disk.",
             "",
             "| trial | job | preempted at | resumed from | final step | restarts | state | "
             "submit->warning | warning->requeued | requeued->done (hold lifted) | passed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, t in enumerate(trials, 1):
        lines.append(f"| {k} | {t.job_id} | {t.preempted_step} | {t.resumed_step} | {t.final_step} | "
                     f"{t.restarts} | {t.state} | {t.submit_to_warning_s:.1f} s | "
                     f"{t.warning_to_requeued_s:.1f} s | {t.requeued_to_completed_s:.1f} s | "
                     f"{'yes' if t.passed else 'NO'} |")
    lines += ["",
              f"- warning to requeued (ranks stopped, snapshot, status 75, `scontrol requeue`): "
              f"{_spread([t.warning_to_requeued_s for t in passed])}",
              f"- requeued to completed (start again, resume, finish): "
              f"{_spread([t.requeued_to_completed_s for t in passed])}",
              f"- whole trial: {_spread([t.total_s for t in passed])}", ""]
    for k, t in enumerate(trials, 1):
        if not t.passed:
            lines += [f"## Trial {k} failed", "", "```", t.problem[-3000:], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kind", choices=KINDS, default="script",
                        help="script: ringtrain script slurm --requeue; run: a batch script of its own with "
                             "ringtrain run --requeue")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    from ringtrain.bench.machine import describe_machine

    machine = describe_machine()
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="requeue-trials-") as tmp:
        root = Path(tmp)
        for name in ("hosts", "slurm"):
            (root / name).mkdir()
        hosts = start_hosts(root / "hosts", bandwidth="1gbit")
        try:
            cluster = start_two_node_cluster(root / "slurm", hosts)
            try:
                for k in range(args.trials):
                    trial = run_trial(cluster, root / f"trial-{k}", args.kind)
                    trials.append(trial)
                    print(f"trial {k + 1}/{args.trials}: {'passed' if trial.passed else 'FAILED'} "
                          f"(preempted at {trial.preempted_step}, resumed from {trial.resumed_step}, final "
                          f"{trial.final_step}, {trial.total_s:.0f} s)", flush=True)
                    if not trial.passed:
                        print(trial.problem[-2000:], flush=True)
            finally:
                cluster.stop()
        finally:
            hosts.stop()
    text = report(trials, machine, args.kind)
    print(text)
    name = "requeue_trials" if args.kind == "script" else "requeue_trials_run"
    write_results(args.out, name, machine,
                  text, {"kind": args.kind, "steps": STEPS, "trials": [t.record() for t in trials],
                         "passed": sum(t.passed for t in trials)})
    return 0 if trials and all(t.passed for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
