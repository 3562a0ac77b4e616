"""ElasticSampler: Horovod's partitioning, progress recording and resumption."""

from __future__ import annotations

import random

import ringtrain as hvd
from ringtrain.elastic import ElasticSampler


def sampler_walk() -> dict:
    hvd.init()
    data = list(range(23))
    sampler = ElasticSampler(data, shuffle=True, seed=3)
    first = list(sampler)
    sampler.record_batch(0, 4)  # every rank did one batch of 4
    state = sampler.state_dict()
    resumed = ElasticSampler(data, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    rest_len = len(resumed)
    resumed.set_epoch(1)
    next_epoch = list(resumed)
    plain = ElasticSampler(data, shuffle=False)
    return {"first": first, "len": len(sampler), "state": state, "rest": rest, "rest_len": rest_len,
            "next": next_epoch, "next_state": resumed.state_dict(), "plain": list(plain)}


def test_partition_record_and_resume(ranks2):
    results = ranks2.run(sampler_walk)
    order = list(range(23))
    random.Random(3).shuffle(order)
    padded = order + order[:1]  # 23 -> 24: padded to a multiple of the 2 ranks by wrapping
    for rank, result in enumerate(results):
        assert result["first"] == padded[rank::2]
        assert result["len"] == 12
        assert result["state"] == {"epoch": 0, "processed_num": 8}
        remaining = order[8:]  # 15 left -> padded to 16
        assert result["rest"] == (remaining + remaining[:1])[rank::2]
        assert result["rest_len"] == 8
        epoch1 = list(range(23))
        random.Random(4).shuffle(epoch1)
        assert result["next"] == (epoch1 + epoch1[:1])[rank::2]
        assert result["next_state"] == {"epoch": 1, "processed_num": 0}
        assert result["plain"] == (list(range(23)) + [0])[rank::2]
    assert sorted(set(results[0]["first"]) | set(results[1]["first"])) == list(range(23))
