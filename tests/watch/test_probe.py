"""The rank's probe: what it records, and that it answers a request for stacks."""

from __future__ import annotations

import json
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from ringtrain.watch import probe
from ringtrain.watch.probe import STACKS_REQUEST, Probe, is_users, record_path, stacks_path, user_frame


@pytest.mark.parametrize(("path", "users"), [
    ("/home/me/train.py", True),
    ("/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", False),
    ("/work/src/ringtrain/optimizer.py", False),
    ("/opt/venv/lib/python3.11/site-packages/mylib/model.py", True),
    (threading.__file__, False),
    ("<frozen runpy>", False),
])
def test_which_frames_are_the_user_s(path, users):
    assert is_users(path) is users


def test_the_user_s_frame_is_the_innermost_outside_libraries():
    def inner():
        return user_frame(sys._getframe())

    path, line, function = inner()
    assert path == __file__
    assert function == "inner"


def test_counters_that_move_are_progress_and_a_still_one_is_not(tmp_path, monkeypatch):
    engine = SimpleNamespace(completed=3, controller=SimpleNamespace(pending={(0, "allreduce.w"): None}))
    monkeypatch.setitem(sys.modules, "ringtrain.engine.state", SimpleNamespace(engine=engine))
    p = Probe(tmp_path, 0)
    first = p.record(now=10.0)
    assert first["engine"] == {"done": 3, "pending": ["allreduce.w"], "pending_count": 1, "arrivals": []}
    assert p.record(now=20.0)["progress_time"] == 10.0
    engine.completed = 4
    assert p.record(now=30.0)["progress_time"] == 30.0


def test_records_are_written_whole_and_stacks_answered_once_per_request(tmp_path):
    p = Probe(tmp_path, 3)
    p.write_once()
    record = json.loads(record_path(tmp_path, 3).read_text())
    assert record["rank"] == 3
    assert record["where"][0] == __file__
    assert not stacks_path(tmp_path, 3).exists()
    (tmp_path / STACKS_REQUEST).write_text("7-1")
    p.write_once()
    head, _, body = stacks_path(tmp_path, 3).read_text().partition("\n")
    assert head == "request 7-1"
    assert "Thread MainThread (main):" in body
    assert "test_probe.py" in body
    stacks_path(tmp_path, 3).unlink()
    p.write_once()
    assert not stacks_path(tmp_path, 3).exists(), "a request is answered once"
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file is left behind"


def test_a_torch_group_s_collectives_are_counted_and_named_once_still(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        p = Probe(tmp_path, 0)
        before = p.record(now=1.0)["sequence"]
        dist.all_reduce(torch.ones(5))
        moved = p.record(now=2.0)
        assert moved["sequence"] == before + 1
        assert moved["progress_time"] == 2.0
        assert moved["collective"] is None, "no flight-recorder dump while the count moves"
        still = p.record(now=3.0)
        if hasattr(sys.modules["torch._C._distributed_c10d"], "_dump_fr_trace_json"):
            assert still["collective"] == {"op": "all_reduce", "sizes": [[5]]}
        assert still["progress_time"] == 2.0
    finally:
        dist.destroy_process_group()


def test_no_probe_without_the_agent_s_folder(tmp_path):
    assert probe.start({"RANK": "0"}) is None
    assert probe.start({"RANK": "0", probe.WATCH_DIR_VARIABLE: str(tmp_path / "missing")}) is None


def test_a_stack_starts_at_the_user_s_script_not_at_the_rank_s_entry_point():
    from traceback import FrameSummary, StackSummary

    frames = StackSummary.from_list([
        FrameSummary("<frozen runpy>", 198, "_run_module_as_main"),
        FrameSummary("/x/ringtrain/launch/worker_entry.py", 281, "<module>"),
        FrameSummary("/usr/lib/python3.11/runpy.py", 291, "run_path"),
        FrameSummary("train.py", 8, "<module>"),
        FrameSummary("/x/torch/optim/optimizer.py", 530, "wrapper"),
    ])
    kept = [f.filename for f in probe._without_launcher(frames)]
    assert kept == ["train.py", "/x/torch/optim/optimizer.py"]


def test_the_probe_is_stopped_and_joined_when_the_interpreter_exits(tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(probe.atexit, "register", lambda fn, *args: registered.append((fn, args)))
    p = probe.start({"RANK": "0", probe.WATCH_DIR_VARIABLE: str(tmp_path)}, interval=0.001)
    assert p is not None
    [(callback, (thread,))] = registered
    assert thread.name == probe.PROBE_THREAD
    assert thread.is_alive()
    callback(thread)
    assert not thread.is_alive()


@pytest.mark.slow
def test_a_rank_whose_probe_is_inside_torch_when_the_script_ends_exits_cleanly(tmp_path):
    # The probe's reading of the group's counter made to last (many calls of the binding, each of which
    # releases the GIL), so that the script ends while the probe is inside torch: without the join at
    # exit the daemon thread comes back into the finalizing interpreter and the process aborts
    # ("terminate called without an active exception") nearly every time.
    import subprocess

    script = tmp_path / "rank.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from ringtrain.watch import probe\n"
        "sequence = probe.TorchGroup.sequence\n"
        "def slow_sequence(self):\n"
        "    for _ in range(2000):\n"
        "        sequence(self)\n"
        "    return sequence(self)\n"
        "probe.TorchGroup.sequence = slow_sequence\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        f"assert probe.start({{'RANK': '0', probe.WATCH_DIR_VARIABLE: {str(tmp_path)!r}}}, interval=0)\n"
        "dist.all_reduce(torch.ones(1))\n"
        "print('done')\n")
    for _ in range(3):
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert (result.returncode, result.stdout.strip()) == (0, "done"), result.stderr
