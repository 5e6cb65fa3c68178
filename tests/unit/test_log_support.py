"""Builders shared by the log tablet tests: stored-column batches and tablets in a temp dir."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from fluvial.broker.log import BatchMeta, FlushPolicy, LogConfig, LogTablet

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")


def records(
    count: int,
    *,
    first_timestamp: int = 1_700_000_000_000,
    timestamps: list[int] | np.ndarray | None = None,
    value_size: int = 16,
    tag: int = 0,
    extra_column: bool = False,
) -> pa.RecordBatch:
    """A batch in the stored layout minus ``_offset``: system columns then user columns."""
    if timestamps is None:
        timestamps = np.arange(first_timestamp, first_timestamp + count, dtype=np.int64)
    keys = [b"key-%d-%d" % (tag, i) for i in range(count)]
    columns = {
        "_timestamp": pa.array(np.asarray(timestamps, dtype=np.int64)).cast(TIMESTAMP_TYPE),
        "_change": pa.array(np.zeros(count, np.int8)),
        "_key": pa.array(keys, pa.binary()),
        "_headers": pa.array([[{"key": "h", "value": b"%d" % i}] for i in range(count)], HEADERS_TYPE),
        "value": pa.array([(b"%d:" % tag) + b"x" * value_size for _ in range(count)], pa.binary()),
        "amount": pa.array(np.arange(count, dtype=np.int64) + tag * 1000),
    }
    if extra_column:
        columns["note"] = pa.array(["n%d" % i for i in range(count)], pa.string())
    return pa.record_batch(columns)


def meta(**fields) -> BatchMeta:
    """A produce-side BatchMeta: offsets and timestamps are left for the tablet to fill."""
    defaults = dict(base_offset=0, last_offset_delta=0, record_count=0, base_timestamp=-1, max_timestamp=-1)
    defaults.update(fields)
    return BatchMeta(**defaults)


def open_tablet(directory: Path, **config) -> LogTablet:
    config.setdefault("flush_policy", FlushPolicy.NONE)
    return LogTablet.open(directory, LogConfig(**config))


def all_rows(tablet: LogTablet, columns: list[str] | None = None) -> pa.Table:
    """Every readable row of the tablet, batch by batch from the log start."""
    batches = []
    offset = tablet.log_start_offset
    while offset < tablet.log_end_offset:
        stored = tablet.read(offset, 1 << 20, columns=columns)
        assert stored, f"read at {offset} returned nothing before the log end"
        batches.extend(s.batch for s in stored)
        offset = stored[-1].meta.next_offset
    return pa.Table.from_batches(batches) if batches else pa.table({})
