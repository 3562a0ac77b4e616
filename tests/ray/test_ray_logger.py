"""ray/ray_logger.py without a cluster: who logs, and the frames an elastic job's ranks append."""

from __future__ import annotations

import threading
import warnings

import pytest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[test,ray]')")

from ringtrain.ray import ray_logger


class Collect:
    def __init__(self) -> None:
        self.values: list = []

    def put(self, value: object) -> None:
        self.values.append(value)


@pytest.fixture
def sink():
    collect = Collect()
    ray_logger.configure(collect)
    yield collect
    ray_logger.configure(None)


def test_only_rank_0_logs_unless_chief_only_is_off(sink: Collect, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "1")
    ray_logger.log({"loss": 1.0})
    assert sink.values == []
    ray_logger.log({"loss": 2.0}, chief_only=False)
    monkeypatch.setenv("HOROVOD_RANK", "0")
    ray_logger.log({"loss": 3.0})
    assert sink.values == [{"loss": 2.0}, {"loss": 3.0}]


def test_logging_without_callbacks_warns_once_and_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    ray_logger.configure(None)
    monkeypatch.setattr(ray_logger, "_warned", False)
    monkeypatch.setenv("HOROVOD_RANK", "0")
    with pytest.warns(UserWarning, match="given no callbacks"):
        ray_logger.log({"loss": 1.0})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ray_logger.log({"loss": 2.0})
    assert caught == []


class MemoryStore:
    """The two calls StoreSink and StoreRelay make of the job store, in memory, append atomic."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def append(self, key: str, value: bytes) -> None:
        with self.lock:
            self.data[key] = self.data.get(key, b"") + value

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def get(self, key: str) -> bytes:
        return self.data[key]

    def clone(self) -> MemoryStore:
        return self

    def close(self) -> None:
        pass


def test_frames_are_read_whole_and_a_partial_one_waits_for_its_rest() -> None:
    store = MemoryStore()
    sink = ray_logger.StoreSink(store)
    for step in range(3):
        sink.put({"step": step})
    data = store.get(ray_logger.LOG_KEY)
    values, offset = ray_logger.read_frames(data[:-3], 0)  # the last frame cut short
    assert values == [{"step": 0}, {"step": 1}]
    rest, end = ray_logger.read_frames(data, offset)
    assert rest == [{"step": 2}]
    assert end == len(data)
    assert ray_logger.read_frames(data, end) == ([], end)


def test_the_store_relay_calls_back_with_every_value_and_raises_a_callbacks_error() -> None:
    store = MemoryStore()
    seen: list = []
    relay = ray_logger.StoreRelay(store, [seen.append])
    sink = ray_logger.StoreSink(store)
    for step in range(5):
        sink.put(step)
    relay.close()  # reads what is left
    assert seen == [0, 1, 2, 3, 4]
    failing = ray_logger.StoreRelay(store, [lambda value: 1 / 0])
    with pytest.raises(ZeroDivisionError):
        failing.close()
