"""``ringtrain run --ray`` against ``ringtrain run``: the same two ranks' training throughput, paired.

Both jobs run the MNIST CNN through the Trainer as the ranks' command (``ringtrain run [--ray ADDR] -np 2
python -m ringtrain train mnist ...``: each rank is a rank of the launcher's job), on this machine: the
Ray one on a local Ray cluster of two CPUs that this benchmark starts (and keeps up during both jobs,
so that its daemons load the machine the same for both). Pairs run back to back, alternating which goes
first; each job's throughput is its optimizer steps over the training seconds it reports itself
(``--results-json``: no start-up, no evaluation).

    python benchmarks/ray_run_bench.py                 # 3 pairs, 1 epoch of 6000 items, 2 ranks x 1 thread
    python benchmarks/ray_run_bench.py --pairs 5 --subset 12000
    python benchmarks/ray_run_bench.py --pairs 2 --cpu-accounting   # and the CPU seconds of every role
    sudo .venv/bin/python benchmarks/ray_run_bench.py --two-hosts --pairs 10 --subset 12000

``--two-hosts``: one rank on each of two hosts of our own (network namespaces ``hostA`` and ``hostB``
with sshd, from ``tests/integration/netns.py``; root), the Ray arm on a Ray node of one CPU on each
(``--ray ADDR -np 2 --nproc-per-node 1``), the other over ssh (``-H hostA:1,hostB:1``), both launched
on hostA; results go to ``ray_run_bench_two_hosts_<cpu>_<date>.*``.

With ``--cpu-accounting`` each job also records the CPU seconds (utime + stime, from /proc) that each role
ran while its ranks lived: the ranks, the driver (``ringtrain run``; the plain job's agent runs in it), the
Ray job's node agent and actors, this local Ray cluster's daemons, this benchmark, and everything else on
the machine (``other``). CPU seconds do not depend on the machine's load, unlike the step rate.

The ratio is Ray / plain throughput per pair (1: the same; the issue asks at least 0.97); the median of
the pairs with a 95 % bootstrap interval. Results go to ``benchmarks/results/ray_run_bench_<cpu>_<date>.*``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import bootstrap_ci
from process_cpu import ROLES, CpuAccount
from results_io import write_results

from ringtrain.bench.machine import describe_machine


def throughput(address: str | None, args: argparse.Namespace, folder: Path,
               two_hosts: TwoHosts | None = None) -> dict[str, float]:
    """One job's optimizer steps per training second, with its steps, seconds and final accuracy.
    ``two_hosts``: run it from hostA with one rank on each host (over ssh, or one per Ray node)."""
    results = folder / f"{'ray' if address else 'plain'}.json"
    if two_hosts is None:
        where = ["--ray", address] if address else []
    else:
        where = ["--ray", address, "--nproc-per-node", "1"] if address else \
            ["-H", "hostA:1,hostB:1", "-i", str(two_hosts.hosts.key), "--start-timeout", "120"]
    argv = [sys.executable, "-m", "ringtrain", "run", *where, "-np", "2", sys.executable, "-m", "ringtrain",
            "train", "mnist", "--threads", "1", "--epochs", str(args.epochs), "--subset", str(args.subset),
            "--no-progress", "--no-resume", "--results-json", str(results)]
    if two_hosts is not None:
        argv = two_hosts.hosts.command("hostA", argv)
    with open(folder / "job.log", "w+") as log:
        env = None if two_hosts is None else two_hosts.env
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=folder)
        account = CpuAccount(job.pid).start() if args.cpu_accounting else None
        code = job.wait()
        if account is not None:
            account.stop()
        log.seek(0)
        output = log.read()
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({code}):\n{output[-3000:]}")
    body = json.loads(results.read_text())
    seconds = sum(float(epoch["seconds"]) for epoch in body["epochs"])
    steps = sum(int(epoch.get("steps") or 0) for epoch in body["epochs"])
    if body["world_size"] != 2 or not steps:
        raise SystemExit(f"{' '.join(argv)} trained on {body['world_size']} rank(s), {steps} steps: not "
                         "the job meant")
    found = {"seconds": seconds, "steps": steps, "steps_per_s": steps / seconds,
             "accuracy": float(body["epochs"][-1].get("accuracy") or float("nan"))}
    if account is not None:
        low, high = account.window()
        found.update({"window_s": high - low, "cpu_s": account.by_role(), "rank_nice": account.rank_nice(),
                      "rank_wait_s": account.rank_wait()})
    return found


class TwoHosts:
    """Two hosts of our own (network namespaces ``hostA`` and ``hostB`` with sshd, the integration tests'
    ``tests/integration/netns.py``, unshaped link) and a Ray cluster over them: the head on hostA, a node
    on hostB, one CPU declared on each, so that ``--ray -np 2 --nproc-per-node 1`` puts a rank on each,
    as ``-H hostA:1,hostB:1`` does. Needs root, ``ip``, ``sshd``."""

    def __init__(self, root: Path) -> None:
        import secrets

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.integration.netns import start_hosts
        from tests.integration.system import clean_env, spawn_daemon

        (root / "hosts").mkdir()
        self.hosts = start_hosts(root / "hosts")
        head = self.hosts.hosts["hostA"].address
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        ray_cli = str(Path(sys.executable).with_name("ray"))
        flags = ["--num-cpus", "1", "--block", "--disable-usage-stats"]
        self.address = f"{head}:6381"
        self.env = clean_env({"RAY_ADDRESS": self.address, **auth})
        self.daemons = [
            spawn_daemon(self.hosts.command("hostA", [ray_cli, "start", "--head", "--port", "6381",
                                                      "--node-ip-address", head, "--include-dashboard=false",
                                                      "--temp-dir", str(root / "ray-a"), *flags]),
                         root / "ray-a.log", env=clean_env(auth)),
            spawn_daemon(self.hosts.command("hostB", [ray_cli, "start", "--address", self.address,
                                                      "--node-ip-address", self.hosts.hosts["hostB"].address,
                                                      "--temp-dir", str(root / "ray-b"), *flags]),
                         root / "ray-b.log", env=clean_env(auth))]

    def stop(self) -> None:
        from tests.integration.system import stop_daemons

        stop_daemons(self.daemons, grace=20)
        self.hosts.stop()


def cpu_table(plain: list[dict], on_ray: list[dict]) -> list[str]:
    """The CPU seconds of each role while the ranks ran, median over the jobs of each arm, and as a
    share of one core over that window."""
    def median(jobs: list[dict], role: str) -> float:
        return statistics.median(job["cpu_s"][role] for job in jobs)

    windows = [statistics.median(job["window_s"] for job in jobs) for jobs in (plain, on_ray)]
    waits = [statistics.median(job["rank_wait_s"] for job in jobs) for jobs in (plain, on_ray)]
    lines = ["CPU seconds while the ranks ran (median of each arm's jobs; % of one core over the window: "
             f"plain {windows[0]:.1f} s, ray {windows[1]:.1f} s). Rank niceness: plain "
             f"{sorted({n for job in plain for n in job['rank_nice']})}, ray "
             f"{sorted({n for job in on_ray for n in job['rank_nice']})}. The ranks waited for a CPU "
             f"(run queue, both together, median): plain {waits[0]:.2f} s, ray {waits[1]:.2f} s.", "",
             "| role | plain CPU s | plain % core | ray CPU s | ray % core |", "|---|---|---|---|---|"]
    for role in ROLES:
        values = [median(jobs, role) for jobs in (plain, on_ray)]
        lines.append(f"| {role} | {values[0]:.2f} | {100 * values[0] / windows[0]:.1f} | {values[1]:.2f} | "
                     f"{100 * values[1] / windows[1]:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--subset", type=int, default=6000, help="training items per epoch")
    parser.add_argument("--cpu-accounting", action="store_true",
                        help="also record the CPU seconds of every process role while the ranks run")
    parser.add_argument("--two-hosts", action="store_true",
                        help="one rank on each of two namespace hosts: -H hostA:1,hostB:1 against a Ray "
                             "node on each (needs root; --cpu-accounting counts the hosts' sshd as Ray's "
                             "daemons)")
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile (for the record)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)

    import ray

    load_before = os.getloadavg()
    two_hosts: TwoHosts | None = None
    scratch = tempfile.TemporaryDirectory(dir="/tmp")
    if args.two_hosts:
        two_hosts = TwoHosts(Path(scratch.name))
        address = two_hosts.address
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        address = ray.get_runtime_context().gcs_address
    plain: list[dict[str, float]] = []
    on_ray: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            for n in range(args.pairs):
                order = (None, address) if n % 2 == 0 else (address, None)  # alternate which goes first
                timed = {where: throughput(where, args, Path(tmp), two_hosts) for where in order}
                plain.append(timed[None])
                on_ray.append(timed[address])
                print(f"pair {n + 1}: plain {timed[None]['steps_per_s']:.2f} steps/s, ray "
                      f"{timed[address]['steps_per_s']:.2f} steps/s", flush=True)
    finally:
        if two_hosts is not None:
            two_hosts.stop()
        else:
            ray.shutdown()
        scratch.cleanup()
    load_after = os.getloadavg()
    ratios = [r["steps_per_s"] / p["steps_per_s"] for r, p in zip(on_ray, plain, strict=True)]
    low, high = bootstrap_ci(ratios)
    machine = describe_machine()
    place = ("two namespace hosts on this machine (hostA, hostB; unshaped veth link), a Ray node of 1 CPU "
             "on each (`--ray ADDR -np 2 --nproc-per-node 1` against `-H hostA:1,hostB:1` over ssh), both up "
             "during both jobs" if two_hosts is not None else
             "one local Ray cluster of 2 CPUs up during both jobs")
    lines = ["# `ringtrain run --ray -np 2` against `ringtrain run -np 2`: training throughput", "",
             f"Machine: {machine.get('cpu')}, {machine.get('cores', '?')} cores; {place}; "
             f"{args.pairs} pairs, {args.epochs} epoch(s) of {args.subset} MNIST "
             "items, 2 ranks x 1 thread, gloo, DDP (the Trainer's default).",
             f"Load: {args.note or 'not noted'}; load average (1, 5, 15 min) "
             f"{', '.join(f'{x:.1f}' for x in load_before)} before, "
             f"{', '.join(f'{x:.1f}' for x in load_after)} after.", "",
             "| pair | plain steps/s | ray steps/s | ray / plain | plain accuracy | ray accuracy |",
             "|---|---|---|---|---|---|"]
    for n, (p, r, ratio) in enumerate(zip(plain, on_ray, ratios, strict=True), 1):
        lines.append(f"| {n} | {p['steps_per_s']:.2f} | {r['steps_per_s']:.2f} | {ratio:.3f} | "
                     f"{p['accuracy']:.4f} | {r['accuracy']:.4f} |")
    lines += ["", f"Median ray / plain: **{statistics.median(ratios):.3f}** (95 % interval "
                  f"[{low:.3f}-{high:.3f}], {args.pairs} pairs)."]
    if args.cpu_accounting:
        lines += ["", *cpu_table(plain, on_ray)]
    text = "\n".join(lines) + "\n"
    print(text)
    name = "ray_run_bench_two_hosts" if two_hosts is not None else "ray_run_bench"
    write_results(args.out, name, machine, text,
                  {"args": {k: str(v) for k, v in vars(args).items() if k != "out"}, "plain": plain,
                   "ray": on_ray, "ratios": ratios, "median_ratio": statistics.median(ratios),
                   "ci95": [low, high], "load_before": load_before, "load_after": load_after})
    return 0


if __name__ == "__main__":
    sys.exit(main())
