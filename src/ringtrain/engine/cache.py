"""The response cache: names seen before get a slot, so steady-state rounds send one bit per name.

Every rank holds an identical copy: entries are inserted, touched and evicted only from decisions that
all ranks take in the same round from the same data, so slot numbers agree everywhere without
messages. Eviction is least-recently-used, with ties broken by slot number.
"""

from __future__ import annotations

from ringtrain.engine.requests import Response


class ResponseCache:
    """Maps (process set id, key) to a slot holding the agreed response."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._slots: list[Response | None] = []
        self._index: dict[tuple[int, str], int] = {}
        self._last_used: dict[int, int] = {}
        self._clock = 0
        #: Bumped whenever the set of entries changes (layouts derived from the cache are recomputed).
        self.version = 0

    def __len__(self) -> int:
        return len(self._index)

    @property
    def num_slots(self) -> int:
        """Length of the bit vector: the high-water mark of slots ever used."""
        return len(self._slots)

    def lookup(self, set_id: int, key: str) -> int | None:
        return self._index.get((set_id, key))

    def response(self, slot: int) -> Response | None:
        return self._slots[slot]

    def insert(self, response: Response) -> int | None:
        """Store an ok response; returns its slot (None when caching is disabled)."""
        if self.capacity == 0:
            return None
        ident = (response.set_id, response.key)
        if ident in self._index:
            self.evict(*ident)
        if len(self._index) >= self.capacity:
            victim = min(self._last_used, key=lambda s: (self._last_used[s], s))
            old = self._slots[victim]
            assert old is not None
            self.evict(old.set_id, old.key)
        free = [i for i, entry in enumerate(self._slots) if entry is None]
        slot = free[0] if free else len(self._slots)
        if slot == len(self._slots):
            self._slots.append(None)
        self._slots[slot] = response
        self._index[ident] = slot
        self.version += 1
        self.touch(slot)
        return slot

    def touch(self, slot: int) -> None:
        self._clock += 1
        self._last_used[slot] = self._clock

    def evict(self, set_id: int, key: str) -> int | None:
        slot = self._index.pop((set_id, key), None)
        if slot is not None:
            self._slots[slot] = None
            self._last_used.pop(slot, None)
            self.version += 1
        return slot

    def evict_set(self, set_id: int) -> list[int]:
        """Drop every entry of a removed process set."""
        return [
            s for (sid, key) in list(self._index) if sid == set_id if (s := self.evict(sid, key)) is not None
        ]
