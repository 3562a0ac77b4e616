"""``ringtrain check`` alone, on two ranks under torchrun, and against a deliberately wrong API."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from ringtrain.cli.check import parse_sizes
from ringtrain.exceptions import UsageError
from tests.integration.system import clean_env
from tests.ranks import free_port

CHECK_TIMEOUT = 300


def _check(*args: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    if nproc == 1:
        argv = [sys.executable, "-m", "ringtrain", "check", *args]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "-m", "ringtrain", "check", *args]
    return subprocess.run(argv, env=clean_env({"GLOO_SOCKET_IFNAME": "lo"}), capture_output=True, text=True,
                          timeout=CHECK_TIMEOUT)


@pytest.mark.parametrize(("text", "sizes"), [("4K,1M", (4096, 1 << 20)), ("100", (100,)),
                                             ("2mb, 1g", (2 << 20, 1 << 30))])
def test_sizes_accept_suffixes(text: str, sizes: tuple[int, ...]) -> None:
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize("text", ["4Q", "", "1,,2", "2"])
def test_bad_sizes_are_usage_errors_that_name_the_value(text: str) -> None:
    with pytest.raises(UsageError, match="HINT"):
        parse_sizes(text)


@pytest.mark.slow
def test_bad_option_exits_2_without_traceback() -> None:
    result = _check("--sizes", "lots")
    assert result.returncode == 2
    assert "'lots'" in result.stderr
    assert "HINT" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_alone_it_is_one_rank_and_passes() -> None:
    result = _check("--sizes", "4K,64K", "--iterations", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "hello from rank 0 of 1 (host " in result.stdout
    assert "device cpu" in result.stdout
    assert "backends: gloo yes" in result.stdout
    assert "control plane: none (one process)" in result.stdout
    assert "all checks passed on 1 rank(s)" in result.stdout
    assert "allreduce bandwidth" in result.stdout
    assert "64 KiB" in result.stdout
    assert "hosts: 1" in result.stdout
    assert "interfaces: lo 127.0.0.1" in result.stdout


@pytest.mark.slow
def test_two_ranks_under_torchrun_say_hello_and_pass() -> None:
    result = _check("--sizes", "4K,256K", "--iterations", "2", nproc=2)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"hello from rank {rank} of 2 (host " in result.stdout
        assert f"local rank {rank}, device cpu" in result.stdout
    assert "environment: torchrun, 2 rank(s)" in result.stdout
    assert "control plane: tcp socket mesh (1 connection(s) per rank" in result.stdout
    assert "large CPU allreduces: shared memory (all ranks on one host)" in result.stdout
    for name in ("allreduce[sum]", "allreduce[average]", "allreduce[min]", "allreduce[max]",
                 "allreduce[product]", "allreduce[large]", "allgather[uneven]", "broadcast[root=1]",
                 "alltoall[equal]",
                 "alltoall[splits]", "reducescatter[sum]", "reducescatter[average]", "barrier"):
        assert any(line.split()[:2] == [name, "ok"] for line in result.stdout.splitlines()), name
    assert "all checks passed on 2 rank(s)" in result.stdout


@pytest.mark.slow
def test_two_ranks_under_ringtrain_run_pass() -> None:
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2",
            sys.executable, "-m", "ringtrain", "check", "--sizes", "4K", "--iterations", "1"]
    result = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert f"hello from rank {rank} of 2 (host " in result.stdout
    assert "all checks passed on 2 rank(s)" in result.stdout


@pytest.mark.slow
def test_a_rank_that_never_comes_is_a_timeout_with_exit_3() -> None:
    # Rank 0 of 2 alone: rank 1 is never started, so the rendezvous cannot complete.
    env = clean_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    result = subprocess.run([sys.executable, "-m", "ringtrain", "check", "--timeout", "5"], env=env,
                            capture_output=True, text=True, timeout=CHECK_TIMEOUT)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "TIMEOUT after 5s while running init" in result.stderr
    assert "rank 0 of 2, main address 127.0.0.1:" in result.stderr


@pytest.mark.slow
def test_json_report_from_rank_0() -> None:
    result = _check("--json", "--sizes", "4K", "--iterations", "1", nproc=2)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert (report["rank"], report["size"], report["ok"], report["failures_all_ranks"]) == (0, 2, True, 0)
    assert report["backends"]["gloo"] is True
    assert report["control_plane"].startswith("tcp socket mesh")
    assert [s["nbytes"] for s in report["bandwidth"]] == [4096]
    assert report["bandwidth"][0]["algbw_mbps"] > 0
    # one host: both ranks on it, its interfaces, no link between hosts, nothing to warn about
    (host,) = report["hosts"]
    assert host["ranks"] == [0, 1]
    assert ["lo", "127.0.0.1"] in host["interfaces"]
    assert [site["rank"] for site in report["sites"]] == [0, 1]
    assert (report["links"], report["warnings"]) == ([], [])


# --- the checker catches wrong answers: the real collectives with one op swapped ----------------

def _min_answers_max(hvd):
    """The real API, except allreduce(op=Min) silently computes Max: a bug check must catch."""
    def allreduce(tensor, *args, op=None, **kwargs):
        return hvd.allreduce(tensor, *args, op=hvd.Max if op == hvd.Min else op, **kwargs)

    names = {name: getattr(hvd, name) for name in dir(hvd) if not name.startswith("_")}
    return SimpleNamespace(**{**names, "allreduce": allreduce})


def _run_checks_with_broken_min() -> list[tuple[str, bool, str]]:
    from ringtrain import check

    hvd = check.load_api()
    hvd.init()
    try:
        results = check.run_collective_checks(_min_answers_max(hvd), torch.device("cpu"))
        total = check.count_failures_everywhere(hvd, sum(not r.ok for r in results))
    finally:
        hvd.shutdown()
    return [(r.name, r.ok, r.detail) for r in results] + [("total", total == 2, str(total))]


def test_a_wrong_reduction_is_reported_with_the_bad_value(ranks2) -> None:
    per_rank = ranks2.run(_run_checks_with_broken_min, timeout=CHECK_TIMEOUT)
    for results in per_rank:
        failed = {name: detail for name, ok, detail in results if not ok}
        assert set(failed) == {"allreduce[min]"}, failed
        assert "values wrong" in failed["allreduce[min]"]
        assert "expected 0.0" in failed["allreduce[min]"]


@pytest.mark.slow
def test_ranks_of_ringtrain_run_name_it_as_their_environment() -> None:
    argv = [sys.executable, "-m", "ringtrain", "run", "-np", "2", sys.executable, "-m", "ringtrain", "check",
            "--no-bandwidth"]
    result = subprocess.run(argv, env=clean_env({"GLOO_SOCKET_IFNAME": "lo"}), capture_output=True, text=True,
                            timeout=CHECK_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "environment: ringtrain-run, 2 rank(s)" in result.stdout
