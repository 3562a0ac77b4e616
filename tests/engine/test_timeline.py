"""Timeline: Chrome-trace JSON on rank 0, from HOROVOD_TIMELINE or start_timeline()."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ringtrain.mpi_ops as hvd
from tests.engine.hvd_env import fresh


def _timeline(folder: str) -> None:
    path = os.path.join(folder, "static.json")
    fresh({"HOROVOD_TIMELINE": path})
    hvd.allreduce(torch.ones(4), name="traced")
    hvd.allgather(torch.ones(2), name="gathered")
    hvd.stop_timeline()
    fresh({"HOROVOD_TIMELINE": "DYNAMIC"})
    hvd.start_timeline(os.path.join(folder, "dynamic.json"), mark_cycles=True)
    hvd.allreduce(torch.ones(4), name="dyn")
    hvd.stop_timeline()
    fresh()
    with pytest.raises(ValueError, match="Set HOROVOD_TIMELINE=DYNAMIC"):
        hvd.start_timeline(os.path.join(folder, "nope.json"))


def test_timeline_json_written_by_rank_zero(ranks2, tmp_path):
    ranks2.run(_timeline, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dynamic.json", "static.json"]
    events = json.loads((tmp_path / "static.json").read_text())
    names = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M"}
    assert {"allreduce.traced", "allgather.gathered"} <= set(names)
    traced = [
        (e["name"], e["ph"]) for e in events if e.get("tid") == names["allreduce.traced"] and e["ph"] != "M"
    ]
    assert traced == [
        ("NEGOTIATE_ALLREDUCE", "B"),
        ("NEGOTIATE_ALLREDUCE", "E"),
        ("ALLREDUCE", "B"),
        ("ALLREDUCE", "E"),
    ]
    dynamic = json.loads((tmp_path / "dynamic.json").read_text())
    assert any(e["name"] == "CYCLE_START" for e in dynamic)
    assert any(e["name"] == "ALLREDUCE" for e in dynamic)
