"""A stand-in for ringtrain's API in one process, and rank sites, for the tests of ``ringtrain.check``."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ringtrain.check.report import RankSite

CPU = torch.device("cpu")


def world_of_one() -> SimpleNamespace:
    """A correct API for a world of one process: every collective returns (a copy of) its input."""

    def alltoall(tensor, splits=None, name=None):
        if splits is None:
            return tensor.clone()
        return tensor.clone(), torch.tensor(list(splits))

    return SimpleNamespace(
        rank=lambda: 0, size=lambda: 1, local_rank=lambda: 0,
        Sum="sum", Average="average", Min="min", Max="max", Product="product", Adasum="adasum",
        allreduce=lambda tensor, name=None, op=None: tensor.clone(),
        allgather=lambda tensor, name=None: tensor.clone(),
        broadcast=lambda tensor, root, name=None: tensor.clone(),
        alltoall=alltoall,
        reducescatter=lambda tensor, name=None, op=None: tensor.clone(),
        barrier=lambda: None,
    )


VERSIONS = {"ringtrain": "0.1.0", "torch": "2.13.0", "python": "3.11.7"}


def site(rank, host, peers=None, clock=0.0, **versions):
    return RankSite(rank=rank, host=host, interfaces=(("lo", "127.0.0.1"), ("eth0", f"10.0.0.{rank}")),
                    peers=peers or {}, clock_offset=clock, versions={**VERSIONS, **versions})
