"""Which produced batches the handler appends on the executor that converted them."""
from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.broker.handlers.produce import _appends_off_loop, _Part
from fluvial.broker.tables import COALESCE_MAX_BATCH_ROWS
from fluvial.protocol.records import parse_batch_header


def _part(records: int, producer_id: int = -1, transactional: bool = False) -> _Part:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=transactional,
                                  producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                  base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 22)
    for i in range(records):
        b.append(i, timestamp=1_700_000_000_000, key=None, value=b"v" * 100, headers=[])
    part = _Part("t", 0, None)
    part.header = parse_batch_header(bytes(b.build()))
    return part


@pytest.mark.parametrize("records, producer_id, transactional, log_append_time, coalesced, expected", [
    (1000, -1, False, None, True, True),                         # a large batch of a plain producer
    (1000, -1, False, None, False, True),
    (1000, 7, False, None, True, False),                         # idempotent: checked on the loop
    (1000, 7, True, None, True, False),                          # transactional
    (1000, -1, False, 1_700_000_000_000, True, False),           # LogAppendTime
    (COALESCE_MAX_BATCH_ROWS, -1, False, None, True, False),     # small: coalesced with its flush window
    (COALESCE_MAX_BATCH_ROWS, -1, False, None, False, True),     # small, but nothing to coalesce with
])
def test_appends_off_loop(records, producer_id, transactional, log_append_time, coalesced, expected):
    part = _part(records, producer_id, transactional)
    assert _appends_off_loop(part, log_append_time, coalesced) is expected
