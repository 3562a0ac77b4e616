"""hvd.barrier() returns on no rank before every member of the set has called it.

Checked by the order of events, not by timing: the late rank writes a marker file just before its
barrier, and every other rank looks for the marker right after its own barrier returns. The late rank
first waits a while so that an early return would be seen; the assertion itself does not depend on
how long.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import ringtrain as hvd
from tests.engine.hvd_env import fresh

#: How long the late rank stays away; only makes an early release observable.
_LATE_S = 1.0


def _mark(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("arrived")
    os.replace(tmp, path)


def late_barrier(folder: str, late: int, use_set: bool, env: dict[str, str]) -> dict:
    fresh(env, process_sets="dynamic" if use_set else None)
    members = list(range(hvd.size()))
    process_set = hvd.add_process_set(members[1:]) if use_set else hvd.global_process_set
    seen = []
    for round_ in range(3):
        marker = Path(folder) / f"late-{round_}"
        if hvd.rank() not in process_set.ranks:
            continue
        if hvd.rank() == late:
            time.sleep(_LATE_S)
            _mark(marker)
        hvd.barrier(process_set=process_set)
        seen.append(marker.exists())
    if use_set:
        hvd.barrier()
        hvd.remove_process_set(process_set)
    return {"seen": seen, "member": hvd.rank() in process_set.ranks}


@pytest.mark.parametrize("env", [{}, {"HOROVOD_CACHE_CAPACITY": "0"}, {"RINGTRAIN_CONTROL_PLANE": "gloo"}],
                         ids=["default", "no-cache", "gloo-rounds"])
@pytest.mark.parametrize("late", [0, 1])
def test_barrier_waits_for_the_late_rank(ranks2, tmp_path, late, env):
    for result in ranks2.run(late_barrier, str(tmp_path), late, False, env):
        assert result["seen"] == [True, True, True]


@pytest.mark.parametrize(("late", "use_set"), [(0, False), (2, False), (2, True)])
def test_barrier_of_three_ranks_and_of_a_process_set(ranks3, tmp_path, late, use_set):
    for result in ranks3.run(late_barrier, str(tmp_path), late, use_set, {}):
        assert result["seen"] == ([True, True, True] if result["member"] else [])
