"""What the log keeps per stored batch is not tracked by the garbage collector.

Under many small producers the BatchMetas and BatchHeaders of open segments and the wire
cache's keys were most of what each collection walked; the collections' pauses stalled the
event loop. These values hold only integers and bytes, so they are created untracked.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import pickle

import pytest

from fluvial.broker import gc_untracked
from fluvial.broker.log import BatchMeta
from fluvial.broker.log.batch_meta import decode_parts, encode_parts
from fluvial.broker.log.segment_format import BatchHeader
from fluvial.broker.wire_cache import WireCache

from .test_log_coalesced import kafka_rows, open_log

compiled = pytest.mark.skipif(gc_untracked._untracked_instances is None, reason="built without the compiled module")


@compiled
def test_batch_meta_and_header_are_created_untracked_however_made():
    meta = BatchMeta(5, 2, 3, 100, 102, producer_id=7, producer_epoch=0, base_sequence=11)
    made = [meta, dataclasses.replace(meta, base_offset=9), copy.copy(meta), pickle.loads(pickle.dumps(meta)),
            BatchMeta.decode(meta.encode())]
    assert [gc.is_tracked(m) for m in made] == [False] * len(made)
    assert made[3] == meta and made[1].base_offset == 9
    header = BatchHeader(0, 10, 20, meta, -1, -1, parts=(meta, meta))
    assert not gc.is_tracked(header)
    parts = decode_parts(encode_parts([meta, made[1]]))
    assert parts == (meta, made[1]) and not gc.is_tracked(parts)


@compiled
def test_only_classes_without_dict_are_accepted_and_tuples_with_tracked_items_stay_tracked():
    class Open:
        pass

    with pytest.raises(TypeError):
        gc_untracked.untracked(Open)
    assert gc.is_tracked(Open())
    holder = gc_untracked.untracked_tuple((1, [2]))
    assert gc.is_tracked(holder)  # a list may be in a cycle: the collector must see it
    assert not gc.is_tracked(gc_untracked.untracked_tuple(("t", 1, 2)))


@compiled
def test_a_coalesced_log_keeps_no_tracked_object_per_batch(tmp_path):
    tablet = open_log(tmp_path / "log", segment_bytes=1 << 20)
    try:
        for i in range(40):
            meta = BatchMeta(-1, 0, 0, -1, -1, producer_id=1, producer_epoch=0, base_sequence=2 * i)
            tablet.append(kafka_rows([b"a", b"b"], 1000 + i, i), meta, coalesce=True)
            if i % 10 == 9:
                tablet.write_pending()
        tablet.write_pending()
        headers = [h for segment in tablet._view.segments for h in segment._headers.values()]
        assert len(headers) == 4 and all(len(h.parts) == 10 for h in headers)
        assert not any(gc.is_tracked(x) for h in headers for x in (h, h.meta, h.parts, *h.parts))
        # Read back as stored (the tuples made while reading are untracked too).
        reopened = open_log(tmp_path / "log", segment_bytes=1 << 20)
        try:
            metas = list(reopened.batch_metas())
            assert len(metas) == 40 and not any(gc.is_tracked(m) for m in metas)
        finally:
            reopened.close()
    finally:
        tablet.close()


@compiled
def test_wire_cache_keys_are_untracked():
    cache = WireCache(1 << 20)
    cache.put("t", 3, 77, b"\0" * 70)
    (key,) = list(cache._entries)
    assert key == ("t", 3, 77) and not gc.is_tracked(key)
