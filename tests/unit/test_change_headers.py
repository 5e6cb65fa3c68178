"""Change types from Kafka record headers: parsed column-wise, stripped from the stored headers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from fluvial.broker.kafka_batches import HEADERS_TYPE
from fluvial.kv.pk_tables import changes_from_headers
from fluvial.errors import InvalidRecordError
from fluvial.kv import ChangeType


def headers(rows):
    return pa.array([None if r is None else [{"key": k, "value": v} for k, v in r] for r in rows], HEADERS_TYPE)


def test_change_header_read_and_stripped_other_headers_kept():
    hs = headers([[("trace", b"t0"), ("fluvial.change", b"-U")],
                  None,
                  [("fluvial.change", b"+I"), ("fluvial.change", b"+U"), ("x", None)],
                  [],
                  [("trace", b"t4")]])
    tomb = np.array([False, False, False, True, False])
    changes, stripped = changes_from_headers(hs, tomb)
    assert changes.tolist() == [ChangeType.UPDATE_BEFORE, ChangeType.INSERT, ChangeType.UPDATE_AFTER,
                                ChangeType.DELETE, ChangeType.INSERT]
    assert stripped.to_pylist() == [[{"key": "trace", "value": b"t0"}], None, [{"key": "x", "value": None}], [],
                                    [{"key": "trace", "value": b"t4"}]]


def test_no_change_header_leaves_the_batch_as_it_is():
    hs = headers([[("trace", b"t")], []])
    changes, same = changes_from_headers(hs, np.array([False, True]))
    assert changes is None and same is hs


def test_invalid_change_headers_name_their_records():
    hs = headers([[("fluvial.change", b"+I")], [("fluvial.change", b"upsert")], [("fluvial.change", b"\xff")]])
    with pytest.raises(InvalidRecordError) as e:
        changes_from_headers(hs, np.zeros(3, bool))
    assert [i for i, _ in e.value.record_errors] == [1, 2]
    assert "'upsert'" in str(e.value)


def test_a_tombstone_cannot_be_an_add():
    hs = headers([[("fluvial.change", b"+U")], [("fluvial.change", b"-D")]])
    with pytest.raises(InvalidRecordError, match="record 0: a record without a value"):
        changes_from_headers(hs, np.array([True, True]))
