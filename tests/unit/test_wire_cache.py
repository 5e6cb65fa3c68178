"""The wire cache serves a tailing consumer's run of batches, chained by their last offset deltas."""
from __future__ import annotations

from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.broker.wire_cache import ENTRY_OVERHEAD, WireCache
from fluvial.protocol.records import parse_batch_header, set_base_offset


def batch(base_offset: int, count: int, value_size: int = 10) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(count):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"v" * value_size, headers=[])
    wire = bytearray(b.build())
    set_base_offset(wire, base_offset, 0)
    return bytes(wire)


def filled(*runs: tuple[int, int]) -> tuple[WireCache, dict[int, bytes]]:
    cache = WireCache(1 << 20)
    batches = {}
    for base, count in runs:
        batches[base] = batch(base, count)
        cache.put("t", 0, base, batches[base])
    return cache, batches


def test_chains_batches_up_to_the_log_end():
    cache, b = filled((0, 3), (3, 1), (4, 5))
    out, size = cache.tail("t", 0, 0, end=9, max_bytes=1 << 20)
    assert out == [b[0], b[3], b[4]]
    assert size == sum(map(len, out))
    # Each batch's header agrees with the chain that found it.
    assert [parse_batch_header(w).base_offset for w in out] == [0, 3, 4]


def test_stops_at_the_log_end_even_if_more_is_cached():
    cache, b = filled((0, 3), (3, 1), (4, 5))
    assert cache.tail("t", 0, 0, end=4, max_bytes=1 << 20)[0] == [b[0], b[3]]


def test_a_hole_ends_the_run_and_a_miss_at_the_start_is_none():
    cache, b = filled((0, 3), (5, 2))
    assert cache.tail("t", 0, 0, end=7, max_bytes=1 << 20)[0] == [b[0]]
    assert cache.tail("t", 0, 3, end=7, max_bytes=1 << 20) is None
    # Mid-batch offsets are not served from the cache (the caller reads the tablet).
    assert cache.tail("t", 0, 1, end=7, max_bytes=1 << 20) is None
    assert cache.tail("t", 1, 0, end=7, max_bytes=1 << 20) is None


def test_max_bytes_bounds_the_run_but_one_batch_always_goes():
    cache, b = filled((0, 3), (3, 3), (6, 3))
    one = len(b[0])
    assert cache.tail("t", 0, 0, end=9, max_bytes=1)[0] == [b[0]]
    assert cache.tail("t", 0, 0, end=9, max_bytes=2 * one)[0] == [b[0], b[3]]
    assert cache.tail("t", 0, 0, end=9, max_bytes=2 * one + 1)[0] == [b[0], b[3]]


def test_evicted_batches_are_not_served():
    one = len(batch(0, 3))
    cache = WireCache(4 * (one + ENTRY_OVERHEAD) + 1)  # room for four entries
    for base in range(0, 30, 3):
        cache.put("t", 0, base, batch(base, 3))
    assert cache.tail("t", 0, 0, end=30, max_bytes=1 << 20) is None
    out, _ = cache.tail("t", 0, 24, end=30, max_bytes=1 << 20)
    assert [parse_batch_header(w).base_offset for w in out] == [24, 27]


def test_memory_held_by_one_record_batches_stays_near_the_bound():
    """A one-record batch used in place is a view of its request frame: the objects around
    it cost more than its bytes, and they count against the bound."""
    import gc
    import tracemalloc

    max_bytes = 1 << 20
    one = batch(0, 1, value_size=8)
    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        cache = WireCache(max_bytes)
        for i in range(40_000):
            frame = bytearray(b"\0" * 12) + one  # a produce request's frame holding the batch
            view = memoryview(frame)[12:]
            set_base_offset(view, 1_000_000 + i, 0)
            cache.put("t", 0, 1_000_000 + i, view)
        del frame, view
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert len(cache._entries) < 40_000  # the bound evicted
    assert held <= 1.5 * max_bytes, (held, len(cache._entries))


def test_a_small_batch_used_in_place_is_kept_as_untracked_bytes():
    """A one-record batch arrives as a view of its request frame; the cache keeps a bytes copy
    (not tracked by the garbage collector, the frame released) and larger views as they are."""
    import gc

    from fluvial.broker.wire_cache import COPY_BELOW_BYTES

    cache = WireCache(1 << 24)
    small = batch(0, 1)
    frame = bytearray(b"\0" * 40 + small)
    view = memoryview(frame)[40:]
    cache.put("t", 0, 0, view)
    kept = cache.get("t", 0, 0)
    assert type(kept) is bytes and kept == small and not gc.is_tracked(kept)
    assert cache.tail("t", 0, 0, end=1, max_bytes=1 << 20)[0] == [small]
    large = batch(1, 1, value_size=COPY_BELOW_BYTES)
    large_view = memoryview(bytearray(large))
    cache.put("t", 0, 1, large_view)
    assert cache.get("t", 0, 1) is large_view
