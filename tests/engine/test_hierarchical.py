"""Hierarchical allreduce and allgather on real ranks, with several "hosts" on this machine.

A rank's host is its host name plus the node rank the launcher gave it (GROUP_RANK here), so setting
GROUP_RANK / LOCAL_RANK / LOCAL_WORLD_SIZE per rank before init makes fake hosts. Results must equal
the flat collectives' exactly, and the engine must have taken the hierarchical path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import ringtrain as hvd
from ringtrain.engine import state
from tests.engine.hvd_env import fresh
from tests.engine.test_adasum import reference

ON = {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_HIERARCHICAL_ALLGATHER": "1"}


@contextlib.contextmanager
def fake_host(layout: list[list[int]], rank: int) -> Iterator[None]:
    """Place this rank on host ``i`` of ``layout`` (lists of global ranks) for one engine's lifetime."""
    host = next(i for i, ranks in enumerate(layout) if rank in ranks)
    names = ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"GROUP_RANK": str(host), "GROUP_WORLD_SIZE": str(len(layout)),
                       "LOCAL_RANK": str(layout[host].index(rank)),
                       "LOCAL_WORLD_SIZE": str(len(layout[host]))})
    try:
        yield
    finally:
        hvd.shutdown()  # the next test starts an engine on the real layout
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _data(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7 * rank + salt)
    values = torch.randn(numel, generator=gen, dtype=torch.float64)
    if dtype.is_floating_point:
        return values.to(dtype)
    return (values * 10).round().to(dtype)


def collectives() -> dict:
    """Allreduce (several ops, dtypes, sizes, fused groups) and allgather (uneven rows)."""
    rank = hvd.rank()
    out: dict = {}
    for op_name in ("Sum", "Average", "Min", "Max", "Product"):
        out[op_name] = hvd.allreduce(_data(rank, 33, torch.float64), name=f"h.{op_name}",
                                     op=getattr(hvd, op_name))
    out["int"] = hvd.allreduce(_data(rank, 1000, torch.int32), name="h.int", op=hvd.Sum)
    out["large"] = hvd.allreduce(_data(rank, 300_000, torch.float32), name="h.large", op=hvd.Sum)
    out["grouped"] = hvd.grouped_allreduce([_data(rank, n, torch.float32, n) for n in (600, 3, 2000)],
                                           name="h.grouped", op=hvd.Average)
    out["gather"] = hvd.allgather(_data(rank, 5 * (rank + 1), torch.float32).view(-1, 5), name="h.gather")
    out["gather_empty"] = hvd.allgather(torch.zeros(0, 3) if rank == 1 else torch.ones(rank + 1, 3),
                                        name="h.gather_empty")
    out["gather_grouped"] = hvd.grouped_allgather([torch.full((rank + 1, 2), float(rank)),
                                                   torch.arange(rank + 2, dtype=torch.int16)], name="h.gg")
    return out


def hierarchical_run(layout: list[list[int]], env: dict[str, str]) -> dict:
    rank = int(os.environ["RANK"])
    with fake_host(layout, rank):
        fresh(env)
        hierarchy = state.require().sets[0].extra["hierarchy"]
        result = collectives()
        result["hosts"] = hierarchy.hosts
        result["runs"] = hierarchy.runs
        result["local_size"] = hvd.local_size()
    fresh({})
    result["flat"] = collectives()
    return result


LAYOUTS = {
    2: [[[0, 1]], [[0], [1]]],
    3: [[[0, 1], [2]], [[0], [1, 2]], [[0, 2], [1]]],
    4: [[[0, 1], [2, 3]], [[0, 2], [1, 3]]],
}


def _check(results: list[dict], layout: list[list[int]]) -> None:
    for result in results:
        assert result["hosts"] == layout
        assert result["runs"] >= 10, "the hierarchical path was not taken"
        for key, flat in result["flat"].items():
            got = result[key]
            if isinstance(flat, list):
                for g, f in zip(got, flat):
                    torch.testing.assert_close(g, f, rtol=1e-6, atol=1e-5)
            else:
                torch.testing.assert_close(got, flat, rtol=1e-6, atol=1e-5)
    for other in results[1:]:  # every rank holds the same bits
        for key in results[0]["flat"]:
            mine, theirs = results[0][key], other[key]
            for a, b in zip(mine if isinstance(mine, list) else [mine], theirs if isinstance(theirs, list)
                            else [theirs]):
                assert torch.equal(a, b), key


@pytest.mark.parametrize("layout", LAYOUTS[2], ids=str)
def test_hierarchical_two_ranks(ranks2, layout):
    _check(ranks2.run(hierarchical_run, layout, ON), layout)


@pytest.mark.parametrize("layout", LAYOUTS[3], ids=str)
def test_hierarchical_three_ranks(ranks3, layout):
    _check(ranks3.run(hierarchical_run, layout, ON), layout)


@pytest.mark.parametrize("layout", LAYOUTS[4], ids=str)
def test_hierarchical_four_ranks(ranks4, layout):
    _check(ranks4.run(hierarchical_run, layout, ON), layout)


def test_hierarchical_over_gloo_groups(ranks3):
    layout = [[0, 2], [1]]
    env = {**ON, "RINGTRAIN_CPU_ALLREDUCE": "gloo"}
    _check(ranks3.run(hierarchical_run, layout, env), layout)


def off_by_default(layout: list[list[int]]) -> int:
    with fake_host(layout, int(os.environ["RANK"])):
        fresh({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"})
        hvd.allreduce(torch.ones(5000), name="h.off")
        return state.require().sets[0].extra["hierarchy"].runs


def test_flat_unless_asked(ranks2):
    assert ranks2.run(off_by_default, [[0], [1]]) == [0, 0]


def hierarchical_adasum(layout: list[list[int]]) -> dict:
    rank = int(os.environ["RANK"])
    with fake_host(layout, rank):
        fresh({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"})
        out = hvd.allreduce(_data(rank, 257, torch.float64), name="h.adasum", op=hvd.Adasum)
        return {"out": out, "runs": state.require().sets[0].extra["hierarchy"].runs}


@pytest.mark.parametrize(("pool", "layout"), [("ranks3", [[0, 2], [1]]), ("ranks4", [[0, 1], [2, 3]])],
                         ids=str)
def test_adasum_by_host(request, pool, layout):
    """Horovod's NCCL Adasum, here on CPU under hierarchical allreduce: average within each host,
    Adasum across the hosts' averages (hosts in order of their first rank)."""
    results = request.getfixturevalue(pool).run(hierarchical_adasum, layout)
    averages = [np.mean([_data(r, 257, torch.float64).numpy() for r in host], axis=0) for host in layout]
    want = torch.from_numpy(reference(averages))
    for result in results:
        assert result["runs"] == 1
        torch.testing.assert_close(result["out"], want)
        assert torch.equal(result["out"], results[0]["out"])


def split_world_set(layout: list[list[int]]) -> dict:
    """A process set of ranks 1..3 across two hosts: the hierarchy follows the set's own members."""
    rank = int(os.environ["RANK"])
    with fake_host(layout, rank):
        fresh(ON, process_sets="dynamic")
        members = hvd.add_process_set([1, 2, 3])
        out = None
        hosts = None
        if rank in members.ranks:
            out = hvd.allreduce(_data(rank, 700, torch.float64), name="h.set", op=hvd.Sum,
                                process_set=members)
            hosts = state.require().sets[members.process_set_id].extra["hierarchy"].hosts
        hvd.barrier()
        return {"out": out, "hosts": hosts}


def test_hierarchical_process_set(ranks4):
    results = ranks4.run(split_world_set, [[0, 1], [2, 3]])
    want = sum(_data(r, 700, torch.float64) for r in (1, 2, 3))
    assert results[0]["out"] is None
    for result in results[1:]:
        assert result["hosts"] == [[1], [2, 3]]
        torch.testing.assert_close(result["out"], want)


def bad_setting() -> str:
    try:
        fresh({"HOROVOD_HIERARCHICAL_ALLREDUCE": "maybe"})
    except ValueError as exc:
        return str(exc)
    finally:
        os.environ.pop("HOROVOD_HIERARCHICAL_ALLREDUCE", None)
    return ""


def test_a_bad_setting_is_named(ranks2):
    for message in ranks2.run(bad_setting):
        assert message.startswith("HOROVOD_HIERARCHICAL_ALLREDUCE='maybe' is not a switch")
        assert "HINT: unset HOROVOD_HIERARCHICAL_ALLREDUCE for the default (off)" in message
