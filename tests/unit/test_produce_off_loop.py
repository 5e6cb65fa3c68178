"""Which produced batches the handler appends on the executor that converted them."""
from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.broker.handlers.produce import _appends_off_loop, _Part
from fluvial.broker.log.tablet import COALESCE_MAX_BYTES
from fluvial.protocol.records import parse_batch_header


def _part(records: int, producer_id: int = -1, transactional: bool = False) -> _Part:
    """A part holding a batch of `records` values of 100 B."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                  base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 22)
    for i in range(records):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"v" * 100, headers=[])
    part = _Part("t", 0, None)
    part.wire = bytearray(b.build())
    part.header = parse_batch_header(part.wire)
    return part


SMALL = 1000           # about 110 KB: coalesced with its flush window under acks=all
LARGE = COALESCE_MAX_BYTES // 100 + 100   # over COALESCE_MAX_BYTES: stored as its own message


@pytest.mark.parametrize("records, producer_id, transactional, log_append_time, coalesced, expected", [
    (LARGE, -1, False, None, True, True),                        # a large batch of a plain producer
    (LARGE, -1, False, None, False, True),
    (LARGE, 7, False, None, True, False),                        # idempotent: checked on the loop
    (LARGE, 7, True, None, True, False),                         # transactional
    (LARGE, -1, False, 1_700_000_000_000, True, False),          # LogAppendTime
    (SMALL, -1, False, None, True, False),                       # coalesced with its flush window
    (SMALL, -1, False, None, False, True),                       # acks=1 or flush none: nothing to coalesce
])
def test_appends_off_loop(records, producer_id, transactional, log_append_time, coalesced, expected):
    part = _part(records, producer_id, transactional)
    assert (len(part.wire) < COALESCE_MAX_BYTES) == (records == SMALL)
    assert _appends_off_loop(part, log_append_time, coalesced) is expected
