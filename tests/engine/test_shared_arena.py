"""The shared-memory allreduce: numerics, zero-copy buffers, growth, refusals, cleanup and failures."""

from __future__ import annotations

import os

import pytest
import torch

from ringtrain.engine import control_plane as cp
from ringtrain.engine import shared_arena
from ringtrain.engine.executor import COMBINE
from ringtrain.engine.requests import MAX, MIN, PRODUCT, SUM
from ringtrain.engine.shared_arena import GRANULE, SharedArena
from tests.engine.test_control_plane import _open_mesh, _per_rank

_REFERENCE = {SUM: torch.add, MIN: torch.minimum, MAX: torch.maximum, PRODUCT: torch.mul}


def _arenas(planes, limit=64 * 1024 * 1024):
    return [SharedArena(plane, limit) for plane in planes]


def _collective(arenas, fn):
    """``fn(rank, arena)`` on every rank at once; fails the test on any exception."""
    out = _per_rank(lambda r: fn(r, arenas[r]), range(len(arenas)))
    errors = {r: v for r, v in out.items() if isinstance(v, BaseException)}
    assert not errors, errors
    return [out[r] for r in range(len(arenas))]


def _ours() -> set[str]:
    return {name for name in os.listdir(shared_arena.SHM_DIR) if name.startswith(f"ringtrain-{os.getpid()}-")}


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("numel", [1, 2, 5, 97, 300_001])
@pytest.mark.parametrize("op", [SUM, MIN, MAX, PRODUCT])
def test_every_rank_gets_the_exact_reduction_for_every_length(size, numel, op):
    inputs = [((torch.arange(numel, dtype=torch.int64) * (r + 3)) % 11 - 5) for r in range(size)]
    expected = inputs[0]
    for part in inputs[1:]:
        expected = _REFERENCE[op](expected, part)
    with _open_mesh(size) as planes:
        arenas = _arenas(planes)

        def run(r, arena):
            flat = inputs[r].clone()
            assert arena.fits(flat.numel() * flat.element_size())
            arena.allreduce(flat, COMBINE[op])
            return flat

        for r, out in enumerate(_collective(arenas, run)):
            assert torch.equal(out, expected), r


def test_float_results_are_bit_identical_across_ranks_and_close_to_the_sum():
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1_000_003, generator=gen) for _ in range(3)]
    with _open_mesh(3) as planes:
        arenas = _arenas(planes)

        def run(r, arena):
            flat = inputs[r].clone()
            arena.fits(flat.numel() * 4)
            arena.allreduce(flat, torch.add)
            return flat

        outs = _collective(arenas, run)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[1], outs[2])
    torch.testing.assert_close(outs[0], inputs[0] + inputs[1] + inputs[2])


def test_finish_runs_once_per_element_on_the_reducing_rank():
    """The postscale is applied to each chunk once, by its owner, before the others copy it."""
    with _open_mesh(3) as planes:
        arenas = _arenas(planes)
        calls: dict[int, int] = {}

        def run(r, arena):
            flat = torch.full((1000,), float(r + 1))
            arena.fits(4000)

            def finish(chunk):
                calls[r] = chunk.numel()
                chunk.mul_(0.5)

            arena.allreduce(flat, torch.add, finish)
            return flat

        outs = _collective(arenas, run)
    assert sum(calls.values()) == 1000
    for out in outs:
        assert torch.equal(out, torch.full((1000,), 3.0))


def test_the_buffer_is_the_segment_itself_so_nothing_is_copied_in():
    with _open_mesh(2) as planes:
        arenas = _arenas(planes)

        def run(r, arena):
            assert arena.fits(4 * 5000)
            buffer = arena.buffer(torch.float32, 5000)
            buffer.fill_(float(r + 1))
            arena.allreduce(buffer, torch.add)
            again = arena.buffer(torch.float32, 5000)
            return buffer.data_ptr() == again.data_ptr(), buffer.clone()

        for same, out in _collective(arenas, run):
            assert same
            assert torch.equal(out, torch.full((5000,), 3.0))


@pytest.mark.parametrize("size", [2, 3])
def test_deliver_hands_over_every_element_once_straight_from_the_segments(size):
    """With ``deliver`` the peers' chunks are read where they lie, not gathered into the buffer."""
    numel = 10_007
    expected = sum(torch.arange(numel, dtype=torch.float64) * (r + 1) for r in range(size))
    with _open_mesh(size) as planes:
        arenas = _arenas(planes)

        def run(r, arena):
            assert arena.fits(8 * numel)
            buffer = arena.buffer(torch.float64, numel)
            buffer.copy_(torch.arange(numel, dtype=torch.float64) * (r + 1))
            result = torch.full((numel,), float("nan"), dtype=torch.float64)
            seen = torch.zeros(numel, dtype=torch.int64)
            pointers = []

            def deliver(start, piece):
                result[start : start + piece.numel()] = piece
                seen[start : start + piece.numel()] += 1
                pointers.append(piece.data_ptr())

            arena.allreduce(buffer, torch.add, deliver=deliver)
            return result, seen, pointers, buffer.clone()

        for r, (result, seen, pointers, buffer) in enumerate(_collective(arenas, run)):
            assert torch.equal(result, expected), r
            assert torch.equal(seen, torch.ones(numel, dtype=torch.int64)), r
            assert len(pointers) == size
            # only this rank's chunk of its own buffer holds the result: nothing was gathered into it
            lo, hi = numel * r // size, numel * (r + 1) // size
            assert torch.equal(buffer[lo:hi], expected[lo:hi])
            others = torch.cat([buffer[:lo], buffer[hi:]])
            assert not torch.equal(others, torch.cat([expected[:lo], expected[hi:]]))


def test_segments_grow_in_granules_to_the_limit_and_larger_tensors_are_refused():
    limit = 3 * GRANULE
    with _open_mesh(2) as planes:
        arenas = _arenas(planes, limit=limit)

        def run(r, arena):
            seen = []
            for nbytes in (1000, GRANULE + 1, GRANULE // 2, limit, limit + 4):
                fits = arena.fits(nbytes)
                seen.append((fits, arena.capacity))
                if fits:
                    flat = torch.full((nbytes // 4,), float(r))
                    arena.allreduce(flat, torch.add)
                    assert torch.equal(flat, torch.full((nbytes // 4,), 1.0))
            return seen

        rows = _collective(arenas, run)
    assert rows[0] == rows[1]
    grown = [(True, GRANULE), (True, 2 * GRANULE), (True, 2 * GRANULE), (True, limit), (False, limit)]
    assert rows[0] == grown


def test_nothing_is_left_in_dev_shm_once_the_segments_are_mapped():
    before = _ours()
    with _open_mesh(2) as planes:
        arenas = _arenas(planes)
        _collective(arenas, lambda r, arena: arena.fits(10 * GRANULE))
        assert _ours() == before
        assert all(arena.capacity == 10 * GRANULE for arena in arenas)


def test_a_rank_that_cannot_create_its_segment_turns_it_off_everywhere(monkeypatch):
    """No /dev/shm (or a full one): every rank keeps the socket ring, and says why."""
    real_create = shared_arena._Segment.create

    def create(nbytes):
        if nbytes == GRANULE and _per_rank_name() == 1:
            raise OSError(28, "No space left on device")
        return real_create(nbytes)

    monkeypatch.setattr(shared_arena._Segment, "create", staticmethod(create))
    before = _ours()
    with _open_mesh(2) as planes:
        arenas = _arenas(planes)
        fits = _collective(arenas, _fits_as(GRANULE))
    assert fits == [False, False]
    assert all("rank 1 could not create its segment" in arena.disabled for arena in arenas)
    assert all("No space left" in arena.disabled for arena in arenas)
    assert _ours() == before


def test_a_failed_regrowth_keeps_the_segments_that_work(monkeypatch):
    real_create = shared_arena._Segment.create

    def create(nbytes):
        if nbytes > GRANULE and _per_rank_name() == 0:
            raise OSError(28, "No space left on device")
        return real_create(nbytes)

    monkeypatch.setattr(shared_arena._Segment, "create", staticmethod(create))
    with _open_mesh(2) as planes:
        arenas = _arenas(planes)
        first = _collective(arenas, _fits_as(100))
        bigger = _collective(arenas, _fits_as(GRANULE + 1))
        again = _collective(arenas, _fits_as(GRANULE))
    assert (first, bigger, again) == ([True, True], [False, False], [True, True])
    assert all(arena.disabled is None and arena.limit == GRANULE for arena in arenas)


def test_ranks_on_different_hosts_never_share_memory():
    rows = [{"ok": True, "node": "boot-a/net:[1]", "name": "x", "token": "00"},
            {"ok": True, "node": "boot-a/net:[2]", "name": "y", "token": "00"}]
    assert "not on one host" in shared_arena._refusal(rows)
    rows[1]["node"] = rows[0]["node"]
    assert shared_arena._refusal(rows) is None


def test_a_peer_segment_must_hold_its_owners_token():
    segment = shared_arena._Segment.create(GRANULE)
    try:
        mapped = shared_arena._map_peer(segment.name, GRANULE, segment.token)
        assert bytes(mapped[:16].tolist()) == segment.token
        with pytest.raises(ValueError, match="token"):
            shared_arena._map_peer(segment.name, GRANULE, bytes(16))
        with pytest.raises(ValueError, match="smaller"):
            shared_arena._map_peer(segment.name, 2 * GRANULE, segment.token)
    finally:
        segment.unlink()
    with pytest.raises(ValueError, match="not a ringtrain segment"):
        shared_arena._map_peer("../etc/passwd", 10, bytes(16))


def test_a_peer_that_dies_mid_allreduce_fails_the_others_instead_of_hanging():
    with _open_mesh(2, round_timeout_s=30.0) as planes:
        arenas = _arenas(planes)
        _collective(arenas, _fits_as(4000))
        planes[1].close()  # rank 1 is gone: its end of every connection closes
        with pytest.raises(cp.ControlPlaneError, match="rank 1"):
            arenas[0].allreduce(torch.ones(1000), torch.add)


# Which simulated rank a thread is (the mesh runs every rank as a thread of this process).
_THREAD_RANK: dict[int, int] = {}


def _fits_as(nbytes):
    def run(r, arena):
        import threading

        _THREAD_RANK[threading.get_ident()] = r
        return arena.fits(nbytes)

    return run


def _per_rank_name() -> int:
    import threading

    return _THREAD_RANK.get(threading.get_ident(), -1)
