"""One node's ranks under torch's elastic agent, run in this process: variables, failures, clean-up."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from ringtrain.launch.agent import NodeSpec, kept_signal_handlers, patched_environ, quiet_torch_logs, run_node
from ringtrain.launch.report import RankFailure
from tests.ranks import free_port

REPORT_ENV = str(Path(__file__).resolve().parent / "scripts" / "report_env.py")


def spec(**fields) -> NodeSpec:
    base = {"nproc": 2, "rdzv_endpoint": f"127.0.0.1:{free_port()}", "rdzv_timeout": 60.0,
            "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}}
    return NodeSpec(**{**base, **fields})


def read_ranks(folder: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.mark.slow
def test_ranks_get_the_spec_variables_and_ours_are_restored(tmp_path):
    assert "RINGTRAIN_TEST_VARIABLE" not in os.environ
    handler = signal.getsignal(signal.SIGTERM)
    node = spec(env={"HOROVOD_CYCLE_TIME": "9", "RINGTRAIN_TEST_VARIABLE": "x"})
    assert run_node(node, [sys.executable, REPORT_ENV, str(tmp_path)]) == 0
    ranks = read_ranks(tmp_path)
    assert sorted(ranks) == [0, 1]
    for rank, env in ranks.items():
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "2")
        assert env["HOROVOD_CYCLE_TIME"] == "9"
        assert env["HOROVOD_RANK"] == str(rank)  # worker_entry derived Horovod's variables
    assert "RINGTRAIN_TEST_VARIABLE" not in os.environ
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ
    assert signal.getsignal(signal.SIGTERM) == handler


@pytest.mark.slow
def test_a_python_rank_that_raises_is_the_root_cause_with_its_traceback(tmp_path, capsys):
    node = spec(host="node7")
    assert run_node(node, [sys.executable, REPORT_ENV, str(tmp_path), "fail"]) == 1
    err = capsys.readouterr().err
    assert err.count("Root cause") == 1
    assert "host       : node7" in err
    assert "rank       : 1" in err
    assert "error      : ValueError: rank one gives up" in err
    assert "traceback  :" in err
    assert 'raise ValueError("rank one gives up")' in err  # the user's frame, not ours


@pytest.mark.slow
def test_a_program_that_exits_non_zero_is_reported_with_its_last_output(tmp_path, capsys):
    script = "echo 'about to fail' >&2; [ \"$RANK\" = 1 ] && exit 3; sleep 30"
    assert run_node(spec(), ["sh", "-c", script]) == 1
    err = capsys.readouterr().err
    assert "rank       : 1" in err
    assert "status     : exit code 3" in err
    assert "last output:" in err
    assert "about to fail" in err


GPU_SCRIPTS = {
    "cuda tensor": "import torch\nif __import__('os').environ['RANK'] == '1':\n    torch.zeros(1).cuda()\n",
    "nccl group": "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
}


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is visible here")
@pytest.mark.parametrize("name", sorted(GPU_SCRIPTS))
def test_a_rank_that_asks_for_a_gpu_where_none_is_visible_gets_a_hint(name, tmp_path, capsys):
    script = tmp_path / "wants_gpu.py"
    script.write_text(GPU_SCRIPTS[name])
    assert run_node(spec(), [sys.executable, str(script)]) == 1
    err = capsys.readouterr().err
    assert err.count("Root cause") == 1
    assert "no CUDA device is visible here" in err
    assert "HINT: on CPU use the gloo backend" in err
    assert "--device cpu" in err


@pytest.mark.slow
def test_an_ordinary_failure_gets_no_gpu_hint(tmp_path, capsys):
    assert run_node(spec(), [sys.executable, REPORT_ENV, str(tmp_path), "fail"]) == 1
    assert "no CUDA device" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_driven_agent_prints_a_marker_instead_of_the_report(tmp_path, capsys):
    assert run_node(spec(failure_marker=True), [sys.executable, REPORT_ENV, str(tmp_path), "fail"]) == 1
    lines = capsys.readouterr().err.splitlines()
    markers = [f for f in map(RankFailure.from_marker, lines) if f is not None]
    assert [m.rank for m in markers] == [1]
    assert not [line for line in lines if "Root cause" in line]


@pytest.mark.slow
@pytest.mark.parametrize("marker", [False, True])
def test_a_node_that_cannot_reach_node_0_says_where_it_looked(marker, capsys):
    closed = free_port()
    node = spec(nproc=1, node_rank=1, min_nodes=2, max_nodes=2, rdzv_endpoint=f"127.0.0.1:{closed}",
                rdzv_timeout=2.0, failure_marker=marker)
    assert run_node(node, ["true"]) == 1
    err = capsys.readouterr().err
    if marker:
        (failure,) = [f for f in map(RankFailure.from_marker, err.splitlines()) if f is not None]
        assert failure.rank == -1
        assert f"rendezvous static at 127.0.0.1:{closed}" in failure.message
    else:
        assert f"node 1 could not start its ranks (rendezvous static at 127.0.0.1:{closed})" in err
        assert "HINT: check that node 0 is reachable" in err


def test_patched_environ_sets_then_restores(monkeypatch):
    monkeypatch.setenv("RINGTRAIN_TEST_KEPT", "before")
    monkeypatch.delenv("RINGTRAIN_TEST_NEW", raising=False)
    with patched_environ({"RINGTRAIN_TEST_KEPT": "during", "RINGTRAIN_TEST_NEW": "1"}):
        assert os.environ["RINGTRAIN_TEST_KEPT"] == "during"
        assert os.environ["RINGTRAIN_TEST_NEW"] == "1"
    assert os.environ["RINGTRAIN_TEST_KEPT"] == "before"
    assert "RINGTRAIN_TEST_NEW" not in os.environ


@pytest.mark.parametrize(("verbose", "level"), [(False, logging.CRITICAL), (True, logging.INFO)])
def test_torch_s_agent_logs_are_quiet_unless_verbose(verbose, level):
    logger = logging.getLogger("torch.distributed.elastic.agent.server.api")
    before = logger.level
    with quiet_torch_logs(verbose):
        assert logger.level == level
    assert logger.level == before


def test_signal_handlers_come_back():
    def mine(signum, frame):
        pass

    saved = signal.signal(signal.SIGTERM, mine)
    try:
        with kept_signal_handlers():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, saved)


@pytest.mark.slow
def test_restarts_that_run_out_report_the_first_failure_and_every_attempt(tmp_path, capsys):
    node = spec(max_restarts=2)
    assert run_node(node, [sys.executable, REPORT_ENV, str(tmp_path), "fail"]) == 1
    err = capsys.readouterr().err
    # each restart is announced as it happens ...
    assert err.count("restarting every rank") == 2
    assert "attempt 0 failed at" in err
    assert "rank 1 on " in err
    # ... and the one report names the job's first failure and lists the attempts
    assert err.count("Root cause") == 1
    assert "job failed after 2 restart(s)" in err
    assert "error      : ValueError: rank one gives up" in err
    for attempt in range(3):
        assert f"    attempt {attempt} ended " in err
    assert "no restart left" in err


def test_the_agents_folder_is_named_for_its_host_and_pid_and_a_dead_agents_goes(tmp_path, monkeypatch):
    # A far host's agent killed with SIGKILL leaves its folder; the next agent there removes it.
    import subprocess

    from ringtrain.launch import agent, temp_folders

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(temp_folders.tempfile, "tempdir", None)  # read TMPDIR again
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=60)
    tag = temp_folders._host_tag()
    stale = tmp_path / f"{agent.RUN_FOLDER_PREFIX}{tag}-{gone.pid}-x1"
    (stale / "ringtrain").mkdir(parents=True)
    live = tmp_path / f"{agent.RUN_FOLDER_PREFIX}{tag}-{os.getppid()}-x2"
    live.mkdir()
    mine = agent.run_folder()
    assert mine.parent == tmp_path
    assert mine.name.startswith(f"{agent.RUN_FOLDER_PREFIX}{tag}-{os.getpid()}-")
    assert not stale.exists()
    assert live.is_dir()
