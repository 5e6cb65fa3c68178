"""Scan planning, batch skipping, row filters and appended-row conversion of the table API."""
from __future__ import annotations

import datetime as dt
import uuid
from concurrent.futures import ThreadPoolExecutor
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as flight
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.broker.flight.append import split_for_kafka, to_stored
from fluvial.broker.flight.errors import to_flight_error
from fluvial.broker.flight.scan import Filter, batch_may_match, filter_mask, plan_scan, scan_bucket
from fluvial.broker.kafka_batches import RAW, stored_schema
from fluvial.broker.log import BatchMeta, LogConfig, LogTablet
from fluvial.broker.log.statistics import compute_stats, decode_stats
from fluvial.broker.tables import Bucket, Table
from fluvial.client.errors import SchemaMismatchError, UnknownColumnError, from_flight
from fluvial.client.wire import ScanRequest, ScanStats
from fluvial.errors import OffsetOutOfRangeError, UnknownTableError


# ---------------------------------------------------------------- skipping

def stats_of(values: list) -> tuple[BatchMeta, dict]:
    """A batch's meta and statistics as the log tablet records them."""
    arr = pa.array(values, pa.int64())
    batch = pa.record_batch({"x": arr})
    meta = BatchMeta(0, len(values) - 1, len(values), 0, 0)
    return meta, decode_stats(compute_stats(batch))


def filt(op: str, value) -> Filter:
    if op in ("in", "not in"):
        return Filter("x", op, pa.array(value, pa.int64()))
    if op in ("is_null", "not_null"):
        return Filter("x", op, None)
    return Filter("x", op, pa.scalar(value, pa.int64()))


def test_batches_without_statistics_are_always_read():
    meta = BatchMeta(0, 0, 1, 0, 0)
    assert batch_may_match(meta, None, [filt("=", 5)])
    assert batch_may_match(meta, {}, [filt("=", 5)])


@pytest.mark.parametrize("op,value,kept", [
    ("=", 5, False), ("=", 15, True), (">", 20, False), (">=", 20, True), ("<", 10, False), ("<=", 10, True),
    ("in", [1, 30], False), ("in", [1, 12], True), ("!=", 12, True), ("is_null", None, False), ("not_null", None, True),
])
def test_range_statistics_decide(op, value, kept):
    assert batch_may_match(*stats_of([10, 12, 20]), [filt(op, value)]) is kept


def test_all_null_batches_match_only_null_tests():
    b = stats_of([None, None])
    assert not batch_may_match(*b, [filt(">", 0)])
    assert batch_may_match(*b, [filt("is_null", None)])
    assert not batch_may_match(*b, [filt("not_null", None)])


def test_nan_rows_keep_a_batch_for_not_equal():
    batch = pa.record_batch({"x": pa.array([5.0, float("nan")])})
    meta, stats = BatchMeta(0, 1, 2, 0, 0), decode_stats(compute_stats(batch))
    f = Filter("x", "!=", pa.scalar(5.0))
    assert filter_mask(batch, [f]).to_pylist() == [False, True]
    assert batch_may_match(meta, stats, [f])
    assert not batch_may_match(meta, stats, [Filter("x", ">", pa.scalar(5.0))])


def test_timestamp_filters_compare_with_the_stored_bounds():
    ts = pa.array([dt.datetime(2024, 1, d, tzinfo=dt.timezone.utc) for d in (1, 2, 3)], pa.timestamp("ms", tz="UTC"))
    batch = pa.record_batch({"ts": ts})
    meta, stats = BatchMeta(0, 2, 3, 0, 0), decode_stats(compute_stats(batch))
    late = dt.datetime(2024, 2, 1, tzinfo=dt.timezone.utc)
    assert not batch_may_match(meta, stats, [Filter("ts", ">=", pa.scalar(late, ts.type))])
    assert batch_may_match(meta, stats, [Filter("ts", "<", pa.scalar(late, ts.type))])


OPS = ["=", "!=", "<", "<=", ">", ">=", "in", "not in", "is_null", "not_null"]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-50, 50)), min_size=1, max_size=30),
       op=st.sampled_from(OPS), value=st.integers(-60, 60), more=st.lists(st.integers(-60, 60), max_size=4))
def test_a_skipped_batch_never_holds_a_matching_row(values, op, value, more):
    f = filt(op, [value, *more] if op in ("in", "not in") else value)
    batch = pa.record_batch({"x": pa.array(values, pa.int64())})
    matching = pc.sum(pc.cast(filter_mask(batch, [f]).fill_null(False), pa.int64())).as_py() or 0
    if not batch_may_match(*stats_of(values), [f]):
        assert matching == 0


# ---------------------------------------------------------------- row filters

def expression(f: Filter) -> pc.Expression:
    """The same condition in Arrow's own expression language."""
    col = pc.field(f.column)
    v = f.plain_value
    return {"=": lambda: col == v, "!=": lambda: col != v, "<": lambda: col < v, "<=": lambda: col <= v,
            ">": lambda: col > v, ">=": lambda: col >= v, "in": lambda: col.isin(v),
            "not in": lambda: ~col.isin(v) & col.is_valid(), "is_null": lambda: col.is_null(),
            "not_null": lambda: col.is_valid()}[f.op]()


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-20, 20)), min_size=1, max_size=40),
       conds=st.lists(st.tuples(st.sampled_from(OPS), st.integers(-25, 25)), min_size=1, max_size=3))
def test_filter_mask_equals_arrow_expressions(values, conds):
    table = pa.table({"x": pa.array(values, pa.int64())})
    filters = [filt(op, [v, v + 1] if op in ("in", "not in") else v) for op, v in conds]
    ours = table.to_batches()[0].filter(filter_mask(table.to_batches()[0], filters))
    expr = expression(filters[0])
    for f in filters[1:]:
        expr = expr & expression(f)
    assert pa.Table.from_batches([ours]).equals(table.filter(expr))


# ---------------------------------------------------------------- appends and scans of a real log tablet

def raw_table() -> Table:
    return Table("t", uuid.uuid4(), {}, 0)


def test_appended_rows_become_the_stored_batch_of_a_raw_table():
    when = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rows = pa.record_batch({"value": pa.array(["a", "b"]), "_key": [b"k", None],
                            "_timestamp": pa.array([when, None], pa.timestamp("us", tz="UTC"))})
    records, meta = to_stored(raw_table(), rows, -1, now_ms=1_800_000_000_000)
    assert records.schema.equals(stored_schema(RAW))
    assert records.column("value").to_pylist() == [b"a", b"b"]
    assert records.column("_timestamp").cast(pa.int64()).to_pylist() == [int(when.timestamp() * 1000),
                                                                         1_800_000_000_000]
    assert records.column("_headers").null_count == 2
    assert (meta.record_count, meta.base_timestamp, meta.max_timestamp) == (2, int(when.timestamp() * 1000),
                                                                           1_800_000_000_000)


@pytest.mark.parametrize("rows,message", [
    ({"other": [b"x"]}, r"missing columns \['value'\], unknown columns \['other'\]"),
    ({"value": [1]}, "'value' is int64, the table holds binary"),
    ({"value": [b"x"], "_offset": [1]}, r"unknown columns \['_offset'\]"),
])
def test_rows_not_matching_the_table_are_refused(rows, message):
    with pytest.raises(SchemaMismatchError, match=message):
        to_stored(raw_table(), pa.record_batch(rows), -1)


def test_large_appends_are_stored_as_kafka_sized_batches():
    rows = pa.record_batch({"value": [b"x" * 1000] * 1000})
    records, meta = to_stored(raw_table(), rows, -1)
    parts = split_for_kafka(records, meta, 100_000)
    assert sum(p.num_rows for p, _ in parts) == 1000
    assert all(p.nbytes <= 110_000 for p, _ in parts) and len(parts) >= 10
    assert all(m.record_count == p.num_rows for p, m in parts)


@pytest.fixture
def bucket(tmp_path):
    table = raw_table()
    tablet = LogTablet.open(tmp_path / "t-0", LogConfig())
    executor = ThreadPoolExecutor(1)
    b = Bucket(table, 0, tablet, executor)
    table.buckets.append(b)
    for k in range(5):  # 5 batches of 10 rows, offsets 0..49
        records, meta = to_stored(table, pa.record_batch({"value": [f"v{k * 10 + i}".encode() for i in range(10)]}),
                                  -1)
        tablet.append(records, meta)
    tablet.flush()  # under flush policy ack, scans see what is durable
    yield b
    tablet.close()
    executor.shutdown()


def test_scan_slices_to_the_offset_range_and_sends_only_the_asked_columns(bucket):
    plan = plan_scan(bucket, ScanRequest("t", 0, ["_offset", "value"], start=13, end=37))
    stats = ScanStats()
    batches = list(scan_bucket(plan, stats))
    got = pa.Table.from_batches(batches)
    assert got.column_names == ["_offset", "value"]
    assert got.column("_offset").to_pylist() == list(range(13, 37))
    assert got.column("value").to_pylist() == [f"v{i}".encode() for i in range(13, 37)]
    assert len(batches) == 1  # small stored batches are sent together
    assert (stats.batches_read, stats.rows_read, stats.rows_sent, stats.end_offset) == (3, 24, 24, 37)
    assert stats.bytes_sent == pa.ipc.get_record_batch_size(batches[0])


class IntColumnFormat:
    """The part of a typed table's value format a scan uses: its user fields."""
    name = "json"
    user_fields = [pa.field("_schema_id", pa.int32(), nullable=False), pa.field("n", pa.int64())]


def test_a_filter_skips_the_batches_whose_bounds_cannot_match(tmp_path):
    table = Table("n", uuid.uuid4(), {}, 0)
    table.value_format = IntColumnFormat()
    tablet = LogTablet.open(tmp_path / "n-0", LogConfig())
    executor = ThreadPoolExecutor(1)
    bucket = Bucket(table, 0, tablet, executor)
    try:
        for k in range(8):
            tablet.append(*to_stored(table, pa.record_batch({"n": pa.array(range(k * 100, k * 100 + 100))}), 0))
        tablet.flush()
        plan = plan_scan(bucket, ScanRequest("n", 0, ["_offset"], filter=[["n", ">=", 350], ["n", "<", 420]]))
        stats = ScanStats()
        got = pa.Table.from_batches(list(scan_bucket(plan, stats)))
        assert got.column_names == ["_offset"]  # the filter column is read, not sent
        assert got.column("_offset").to_pylist() == list(range(350, 420))
        assert (stats.batches_read, stats.batches_skipped, stats.rows_read) == (8, 6, 200)
    finally:
        tablet.close()
        executor.shutdown()


def test_scan_plan_errors(bucket):
    with pytest.raises(UnknownColumnError, match="no column 'nope'"):
        plan_scan(bucket, ScanRequest("t", 0, ["nope"]))
    with pytest.raises(OffsetOutOfRangeError, match=r"start offset 51 is out of range: .*\[0, 50\)"):
        plan_scan(bucket, ScanRequest("t", 0, start=51))
    with pytest.raises(OffsetOutOfRangeError, match="end offset 60"):
        plan_scan(bucket, ScanRequest("t", 0, end=60))
    assert plan_scan(bucket, ScanRequest("t", 0, start="latest")).start == 50
    assert plan_scan(bucket, ScanRequest("t", 0, end=60, follow=True)).end == 60


# ---------------------------------------------------------------- wire

def test_scan_requests_round_trip_with_typed_filter_values():
    when = dt.datetime(2024, 5, 1, 12, tzinfo=dt.timezone.utc)
    req = ScanRequest("t", 2, ["a"], start={"timestamp": 5}, end=9,
                      filter=[["k", "=", b"\x00\xff"], ["ts", ">=", when], ["n", "in", [1, 2]]], follow=True)
    back = ScanRequest.from_bytes(req.to_bytes())
    assert back == req


def test_errors_keep_their_class_and_message_across_flight():
    for exc in (UnknownTableError("Unknown table 'x'"), UnknownColumnError("no column 'c'"),
                OffsetOutOfRangeError("start offset 9 is out of range")):
        wire = to_flight_error(exc)
        assert isinstance(wire, flight.FlightServerError)
        back = from_flight(wire)
        assert type(back) is type(exc) and str(back) == str(exc)
    internal = from_flight(to_flight_error(ZeroDivisionError("boom")))
    assert "internal error: ZeroDivisionError: boom" in str(internal)


def test_a_call_the_broker_cancels_or_cannot_take_reads_as_the_broker_gone():
    # A stopping broker cancels its in-flight streams; readers resume as after UNAVAILABLE.
    from fluvial.client.errors import BrokerUnavailableError
    for wire in (flight.FlightCancelledError("Server never sent a data message"),
                 flight.FlightUnavailableError("connection refused")):
        assert isinstance(from_flight(wire), BrokerUnavailableError)
    assert not isinstance(from_flight(flight.FlightInternalError("x")), BrokerUnavailableError)
