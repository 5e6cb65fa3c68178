"""The native source's planning without a Spark session: types, offset ranges, admission, filters, options."""
from __future__ import annotations

import datetime as dt
import importlib
import random

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark>=4.0')")

from pyspark.sql.datasource import (  # noqa: E402
    EqualNullSafe, EqualTo, GreaterThan, In, IsNotNull, IsNull, LessThanOrEqual, Not, StringStartsWith,
)

from fluvial.schema.arrow_mapping import avro_to_arrow  # noqa: E402
from fluvial.spark import KafkaJarsError, kafka_jars  # noqa: E402
from fluvial.spark.filters import to_fluvial  # noqa: E402
from fluvial.spark.source import BucketRange, FluvialSparkError, Options, admit, split_ranges  # noqa: E402
from fluvial.spark.types import arrow_schema, conform, spark_schema  # noqa: E402
from tests.unit.test_schema_codecs import SCHEMA20, make_record  # noqa: E402


def test_batches_of_every_avro_type_take_exactly_the_arrow_schema_spark_requires():
    schema = avro_to_arrow(SCHEMA20)
    records = [make_record(random.Random(1), i) for i in range(50)]
    for r in records:
        r["attrs"] = list(r["attrs"].items())
    batch = pa.Table.from_pylist(records, schema=schema).combine_chunks().to_batches()[0]
    target = arrow_schema(spark_schema(schema))
    out = conform(batch, target)
    assert out.schema.equals(target)  # names, types and nullability: what Spark 4.2 checks
    assert out.column("t_ms").to_pylist() == [r["t_ms"].hour * 3_600_000 + r["t_ms"].minute * 60_000
                                              + r["t_ms"].second * 1000 + r["t_ms"].microsecond // 1000
                                              for r in records]
    assert out.column("ts_ms").to_pylist() == [r["ts_ms"] for r in records]
    assert out.column("digest").to_pylist() == [r["digest"] for r in records]
    assert out.column("amount").to_pylist() == [r["amount"] for r in records]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 10**5))
def test_split_ranges_cover_the_range_once_in_bounded_pieces(start, length, size):
    parts = split_ranges(3, start, start + length, size)
    assert all(isinstance(p, BucketRange) and p.bucket == 3 for p in parts)
    assert all(0 < p.end - p.start <= size for p in parts)
    covered = [o for p in parts for o in (p.start, p.end)]
    assert covered == sorted(covered)
    assert sum(p.end - p.start for p in parts) == length
    if length:
        assert parts[0].start == start and parts[-1].end == start + length


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from([str(b) for b in range(6)]), st.tuples(st.integers(0, 1000), st.integers(0, 5000)),
                       min_size=1), st.one_of(st.none(), st.integers(1, 3000)))
# A limit of one row per bucket, where proportional shares alone left a bucket of one row behind.
@example(buckets={"0": (0, 1), "1": (0, 1), "2": (0, 4)}, limit=3)
def test_admission_stays_within_the_limit_and_moves_every_waiting_bucket(buckets, limit):
    start = {b: lo for b, (lo, _) in buckets.items()}
    latest = {b: lo + extra for b, (lo, extra) in buckets.items()}
    end = admit(start, latest, limit)
    waiting = sum(latest[b] - start[b] for b in latest)
    taken = sum(end[b] - start[b] for b in latest)
    assert all(start[b] <= end[b] <= latest[b] for b in latest)
    if limit is None or waiting <= limit:
        assert end == latest
    else:
        assert taken <= limit
        assert taken >= min(limit, waiting) - len(latest)  # the budget is used, up to rounding
        if limit >= len(latest):
            assert all(end[b] > start[b] for b in latest if latest[b] > start[b])


TYPES = {"id": pa.int64(), "small": pa.int8(), "city": pa.string(), "price": pa.float64(), "day": pa.date32(),
         "flag": pa.bool_(), "at": pa.timestamp("ms", tz="UTC"), "amount": pa.decimal128(10, 2),
         "address": pa.struct([("zip", pa.int32())])}


@pytest.mark.parametrize("spark_filter, expected", [
    (EqualTo(("id",), 5), ("id", "=", 5)),
    (GreaterThan(("id",), -3), ("id", ">", -3)),
    (LessThanOrEqual(("city",), "M"), ("city", "<=", "M")),
    (In(("city",), ("Lyon", "Oslo")), ("city", "in", ["Lyon", "Oslo"])),
    (Not(In(("id",), (1, 2))), ("id", "not in", [1, 2])),
    (Not(EqualTo(("id",), 7)), ("id", "!=", 7)),
    (IsNull(("city",)), ("city", "is_null", None)),
    (IsNotNull(("price",)), ("price", "not_null", None)),
    (Not(IsNull(("city",))), ("city", "not_null", None)),
    (EqualTo(("price",), 2.5), ("price", "=", 2.5)),
    (EqualTo(("day",), dt.date(2024, 3, 1)), ("day", "=", dt.date(2024, 3, 1))),
    (EqualTo(("flag",), True), ("flag", "=", True)),
    (EqualNullSafe(("id",), 4), ("id", "=", 4)),
    # Kept in Spark: where the broker could answer differently, or cannot answer at all.
    (GreaterThan(("price",), 1.0), None),         # NaN orders above numbers in Spark
    (EqualTo(("price",), float("nan")), None),
    (In(("city",), ("Lyon", None)), None),          # a null in the list: null, not false
    (Not(EqualNullSafe(("id",), 4)), None),         # holds for nulls, `!=` drops them
    (EqualTo(("small",), 300), None),               # does not fit the column
    (EqualTo(("at",), dt.datetime(2024, 1, 1)), None),
    (EqualTo(("amount",), 1), None),
    (EqualTo(("address", "zip"), 1), None),
    (EqualTo(("nope",), 1), None),
    (StringStartsWith(("city",), "L"), None),
    (EqualTo(("id",), "5"), None),
])
def test_spark_filters_become_broker_filters_only_where_results_agree(spark_filter, expected):
    assert to_fluvial(spark_filter, TYPES) == expected


def test_options_are_checked_with_clear_messages():
    opts = Options.parse({"table": "t", "startingOffsets": '{"t": {"0": 5, "1": -2}}', "columns": "a, b"})
    assert opts.starting == {0: 5, 1: -2} and opts.columns == ("a", "b") and opts.ending == "latest"
    assert Options.parse({"path": "t"}, streaming=True).starting == "latest"
    for bad, message in [({}, "option 'table' is required"),
                         ({"table": "t", "columns": "a,a"}, "names a column twice"),
                         ({"table": "t", "endingOffsets": "[1]"}, "endingOffsets must be"),
                         ({"table": "t", "startingOffsets": '{"u": {"0": 1}}'}, "names table 'u'"),
                         ({"table": "t", "maxRecordsPerTrigger": "0"}, "must be a positive number")]:
        with pytest.raises(FluvialSparkError, match=message):
            Options.parse(bad)


def test_kafka_jars_without_cache_or_maven_fail_saying_what_to_do(tmp_path, monkeypatch):
    cache = importlib.import_module("fluvial.spark.kafka_jars")
    monkeypatch.setenv("FLUVIAL_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn
    assert cache.cache_dir("4.2.0") == tmp_path / "empty-cache" / "spark-kafka-4.2.0"
    with pytest.raises(KafkaJarsError, match=r"not cached in .*empty-cache.* Maven \(mvn\) is not on PATH"):
        kafka_jars("4.2.0")
