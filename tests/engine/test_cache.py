"""The response cache: slots, LRU eviction, invalidation (pure, no ranks)."""

from __future__ import annotations

from ringtrain.engine.cache import ResponseCache
from ringtrain.engine.requests import OpType, RequestMeta, Response


def _response(key: str, set_id: int = 0) -> Response:
    meta = RequestMeta(
        key=key, names=(key,), op=OpType.ALLREDUCE, set_id=set_id, dtypes=("float32",), shapes=((2,),)
    )
    return Response(key, set_id, OpType.ALLREDUCE, {0: meta})


def test_insert_lookup_and_slot_reuse():
    cache = ResponseCache(4)
    slots = [cache.insert(_response(k)) for k in "abc"]
    assert slots == [0, 1, 2]
    assert cache.lookup(0, "b") == 1
    assert cache.lookup(1, "b") is None  # names are per process set
    assert cache.evict(0, "b") == 1
    assert cache.lookup(0, "b") is None
    assert cache.insert(_response("d")) == 1  # lowest free slot
    assert cache.num_slots == 3


def test_least_recently_used_entry_is_evicted_when_full():
    cache = ResponseCache(2)
    cache.insert(_response("a"))
    cache.insert(_response("b"))
    cache.touch(cache.lookup(0, "a"))
    cache.insert(_response("c"))
    assert cache.lookup(0, "b") is None
    assert cache.lookup(0, "a") is not None
    assert cache.lookup(0, "c") is not None
    assert len(cache) == 2


def test_capacity_zero_disables_caching():
    cache = ResponseCache(0)
    assert cache.insert(_response("a")) is None
    assert cache.num_slots == 0


def test_evict_set_drops_only_that_set():
    cache = ResponseCache(8)
    cache.insert(_response("a", 0))
    cache.insert(_response("a", 1))
    cache.insert(_response("b", 1))
    assert sorted(cache.evict_set(1)) == [1, 2]
    assert cache.lookup(0, "a") == 0
    assert len(cache) == 1
