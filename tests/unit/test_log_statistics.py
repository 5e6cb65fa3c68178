"""Per-batch column statistics: stored with each batch, exact, and usable to skip batches."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest
import pyarrow.compute as pc
import pyarrow.ipc as ipc
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.broker.log import LogConfig, LogTablet, statistics
from fluvial.broker.log.statistics import ColumnStats, compute_stats, decode_stats
from tests.unit.test_log_support import all_rows, meta, open_tablet, records


def with_columns(count: int, **columns) -> pa.RecordBatch:
    batch = records(count)
    for name, array in columns.items():
        batch = batch.append_column(name, array)
    return batch


def test_statistics_cover_numeric_and_temporal_user_columns(tmp_path):
    tablet = open_tablet(tmp_path)
    batch = with_columns(
        4,
        price=pa.array([2.5, None, -1.0, float("nan")]),
        day=pa.array([3, 1, None, 2], pa.int32()).cast(pa.date32()),
        at=pa.array([10, 40, 20, 30]).cast(pa.timestamp("us")),
        flag=pa.array([False, None, False, False]),
        name=pa.array(["b", "a", "c", "d"]),
        empty=pa.array([None] * 4, pa.int16()),
    )
    tablet.append(batch, meta())

    [(written, stats)] = list(tablet.batch_statistics())

    assert written.base_offset == 0
    # System columns and strings carry no statistics; NaN does not widen float bounds.
    assert set(stats) == {"amount", "price", "day", "at", "flag", "empty"}
    assert stats["amount"] == ColumnStats(0, 3, 0)
    assert stats["price"] == ColumnStats(-1.0, 2.5, 1)
    assert stats["day"] == ColumnStats(1, 3, 1)
    assert stats["at"] == ColumnStats(10, 40, 0)
    assert stats["flag"] == ColumnStats(False, False, 1)
    assert stats["empty"] == ColumnStats(None, None, 4)


def test_statistics_are_in_the_segment_file_and_survive_reopen(tmp_path):
    tablet = open_tablet(tmp_path)
    for i in range(3):
        tablet.append(records(5, tag=i), meta())
    tablet.close()

    reopened = open_tablet(tmp_path)
    assert [s["amount"] for _, s in reopened.batch_statistics()] == [
        ColumnStats(i * 1000, i * 1000 + 4, 0) for i in range(3)
    ]
    [segment] = tmp_path.glob("*.arrows")
    customs = [c for _, c in ipc.open_stream(segment).iter_batches_with_custom_metadata()]
    assert decode_stats(customs[1][b"fluvial.stats"])["amount"] == ColumnStats(1000, 1004, 0)


def test_a_filtered_scan_reads_only_batches_whose_bounds_match(tmp_path):
    tablet = open_tablet(tmp_path, segment_bytes=4096)
    for i in range(30):
        tablet.append(records(10, tag=i), meta())

    wanted = [m for m, s in tablet.batch_statistics() if s["amount"].max >= 25_000]
    rows = pa.Table.from_batches([tablet.read(m.base_offset, 1)[0].batch for m in wanted])

    assert [m.base_offset for m in wanted] == list(range(250, 300, 10))
    expected = all_rows(tablet).filter(pc.field("amount") >= 25_000)
    assert rows.filter(pc.field("amount") >= 25_000).equals(expected)
    assert list(tablet.batch_statistics(255))[0][0].base_offset == 250


def test_statistics_can_be_turned_off(tmp_path):
    tablet = LogTablet.open(tmp_path, LogConfig(batch_statistics=False))
    tablet.append(records(3), meta())
    assert [s for _, s in tablet.batch_statistics()] == [{}]


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.floats(width=32), st.integers(-2**40, 2**40)), min_size=1, max_size=40))
def test_bounds_match_arrow(values):
    floats = pa.array([None if v is None else float(v) for v in values], pa.float64())
    ints = pa.array([None if v is None or isinstance(v, float) else v for v in values], pa.int64())
    stats = decode_stats(compute_stats(pa.record_batch({"f": floats, "i": ints})))
    for name, array in (("f", floats), ("i", ints)):
        finite = [v for v in array.to_pylist() if v is not None and not (isinstance(v, float) and math.isnan(v))]
        if not finite and array.null_count < len(array):
            assert name not in stats  # only NaN: no bounds to give
            continue
        assert stats[name].null_count == array.null_count
        assert (stats[name].min, stats[name].max) == ((min(finite), max(finite)) if finite else (None, None))


_DENSE_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64(), pa.float32(),
                pa.float64(), pa.bool_(), pa.date32(), pa.time32("ms"), pa.time64("us"), pa.timestamp("ms", "UTC"),
                pa.duration("s")]


@settings(max_examples=200, deadline=None)
@given(data=st.data(), type_index=st.integers(0, len(_DENSE_TYPES) - 1), cut=st.integers(0, 3))
def test_bounds_of_columns_without_nulls_match_arrow(data, type_index, cut):
    """Columns without nulls (read through NumPy views of their buffers, sliced too) get
    the bounds Arrow's min_max gives; NaN is skipped as Arrow skips it."""
    arrow_type = _DENSE_TYPES[type_index]
    if pa.types.is_floating(arrow_type):
        width = 32 if arrow_type == pa.float32() else 64
        values = data.draw(st.lists(st.floats(width=width), min_size=1, max_size=40))
    elif pa.types.is_boolean(arrow_type):
        values = data.draw(st.lists(st.booleans(), min_size=1, max_size=40))
    else:
        storage = pa.int64() if arrow_type.bit_width == 64 else pa.int32()
        if pa.types.is_integer(arrow_type):
            storage = arrow_type
        info = (-(2 ** (storage.bit_width - 1)), 2 ** (storage.bit_width - 1) - 1)
        if pa.types.is_unsigned_integer(storage):
            info = (0, 2 ** storage.bit_width - 1)
        if arrow_type == pa.time32("ms"):
            info = (0, 86_399_999)
        elif arrow_type == pa.time64("us"):
            info = (0, 86_399_999_999)
        values = data.draw(st.lists(st.integers(*info), min_size=1, max_size=40))
        values = pa.array(values, storage).view(arrow_type) if storage != arrow_type else values
    array = pa.array(values, arrow_type) if isinstance(values, list) else values
    array = array.slice(min(cut, len(array) - 1))
    stats = decode_stats(compute_stats(pa.record_batch({"c": array})))
    plain = array.view(pa.int64() if arrow_type.bit_width == 64 else pa.int32()) \
        if pa.types.is_temporal(arrow_type) or pa.types.is_duration(arrow_type) else array
    bounds = pc.min_max(plain)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None or (isinstance(low, float) and math.isnan(low)):
        assert "c" not in stats or (stats["c"].min, stats["c"].max) == (None, None)
        return
    assert stats["c"].null_count == 0
    assert (stats["c"].min, stats["c"].max) == (low, high)
    assert type(stats["c"].min) is type(low)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), type_index=st.integers(0, len(_DENSE_TYPES) - 1), cut=st.integers(0, 3))
def test_compiled_bounds_equal_the_numpy_ones(data, type_index, cut):
    """The compiled bounds (`broker/log/_bounds.c`) give the statistics the NumPy
    reductions give, for every dense type, sliced columns and floats with NaN and ±0.0."""
    if not statistics.USE_NATIVE:
        pytest.skip("compiled bounds not built")
    arrow_type = _DENSE_TYPES[type_index]
    if pa.types.is_floating(arrow_type):
        width = 32 if arrow_type == pa.float32() else 64
        values = data.draw(st.lists(st.floats(width=width) | st.sampled_from([0.0, -0.0, float("nan")]),
                                    min_size=1, max_size=40))
        array = pa.array(values, arrow_type)
    elif pa.types.is_boolean(arrow_type):
        array = pa.array(data.draw(st.lists(st.booleans(), min_size=1, max_size=40)), arrow_type)
    else:
        storage = arrow_type if pa.types.is_integer(arrow_type) else (
            pa.int64() if arrow_type.bit_width == 64 else pa.int32())
        bits = storage.bit_width
        low, high = (0, 2 ** bits - 1) if pa.types.is_unsigned_integer(storage) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        array = pa.array(data.draw(st.lists(st.integers(low, high), min_size=1, max_size=40)), storage).view(arrow_type)
    batch = pa.record_batch({"c": array.slice(min(cut, len(array) - 1))})
    compiled = compute_stats(batch)
    statistics.USE_NATIVE = False
    try:
        reference = compute_stats(batch)
    finally:
        statistics.USE_NATIVE = True
    assert decode_stats(compiled) == decode_stats(reference)
