"""format("fluvial") union reads on Spark (local[2]) of tables tiered by the real tiering
round: equal to the client's union read, with projection and pushed filters, after
retention; primary-key tables give their current rows; lake-only and log-only reads."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")
pytest.importorskip("pyiceberg")


import fluvial.spark  # noqa: E402
from fluvial.client import connect  # noqa: E402
from tests.integration.test_union_read_tiered import (  # noqa: E402
    LAKE, SCHEMA, add_nullable_note_column, kafka_rows, lake_broker, produce_json, tier,
)
from tests.support.lake import sort_rows  # noqa: E402

__all__ = ["lake_broker"]  # the module-scoped broker fixture, shared


def read(spark, broker, table: str, **options):
    r = spark.read.format("fluvial").option("url", broker.flight_url).option("table", table)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows(df) -> list[dict]:
    return [r.asDict() for r in df.collect()]


def test_spark_union_equals_client_union_and_kafka(spark, lake_broker):
    name = f"su-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        client.create_table(name, SCHEMA, buckets=2, configs=LAKE)
        produce_json(lake_broker, name, range(0, 2000), 2)
        tier(lake_broker, name)
        produce_json(lake_broker, name, range(2000, 2300), 2)
        t = client.table(name)
        expected = kafka_rows(lake_broker, name)

        df = read(spark, lake_broker, name, includeMetadata="true")
        got = sorted(({k: r[k] for k in ("id", "city", "amount", "_bucket", "_offset")} for r in rows(df)),
                     key=lambda r: (r["_bucket"], r["_offset"]))
        assert got == expected
        assert df.rdd.getNumPartitions() == 2   # lake files and log ranges packed: a task per bucket
        # offsets inside the lake snapshot: the lake rows are cut to them
        part = read(spark, lake_broker, name, source="union", columns="_bucket,_offset",
                    startingOffsets='{"0": 100, "1": 0}', endingOffsets='{"0": 500, "1": 50}').toArrow()
        assert sorted(zip(part["_bucket"].to_pylist(), part["_offset"].to_pylist())) == \
            [(0, o) for o in range(100, 500)] + [(1, o) for o in range(50)]
        client_union = t.scan(columns=["id", "amount"]).to_arrow()
        spark_union = read(spark, lake_broker, name, columns="id,amount").toArrow()
        assert sort_rows(spark_union, ["id"]) == sort_rows(client_union, ["id"])

        # pushed filters, exactly as the client's
        df = read(spark, lake_broker, name, pushFilters="true").where("amount >= 500 AND city != 'Lima'")
        want = sorted(r["id"] for r in expected if r["amount"] >= 500 and r["city"] not in (None, "Lima"))
        assert sorted(r["id"] for r in rows(df.select("id"))) == want

        assert read(spark, lake_broker, name, source="lake").count() == 2000
        assert read(spark, lake_broker, name, source="log").count() == 2300

        # Retention removes tiered rows from the broker: the union still has them.
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
        ends = t.lake_info().offsets
        for fut in admin.delete_records([TopicPartition(name, b, o) for b, o in ends.items()]).values():
            fut.result(timeout=10)
        assert read(spark, lake_broker, name, source="log").count() == 300
        got = read(spark, lake_broker, name, columns="id").toArrow()
        assert sorted(got["id"].to_pylist()) == list(range(2300))

        with pytest.raises(Exception, match="source"):
            read(spark, lake_broker, name, source="warehouse").count()


def test_spark_union_of_pk_table_is_its_current_rows(spark, lake_broker):
    name = f"sp-{uuid.uuid4().hex[:8]}"
    schema = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.string())])
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, schema, buckets=2, primary_key=["k"], configs=LAKE)
        t.upsert(pa.table({"k": list(range(300)), "v": ["a"] * 300}, schema=schema))
        tier(lake_broker, name)
        t.upsert(pa.table({"k": list(range(250, 350)), "v": ["b"] * 100}, schema=schema))
        t.delete([{"k": k} for k in range(0, 350, 3)])
        expected = sort_rows(t.lookup([{"k": k} for k in range(400)]), ["k"])
        got = read(spark, lake_broker, name, source="union").toArrow()
        assert sort_rows(got, ["k"]) == expected
        # without `source` a primary-key table reads its changelog, as the client does
        assert read(spark, lake_broker, name).count() > len(expected)


# -- fluvial.spark.read_table: the lake snapshot through Spark's own Parquet reader ------------

def fields(df) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in df.schema.fields]


def test_read_table_equals_kafka_and_format_fluvial(spark, lake_broker):
    name = f"rt-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        client.create_table(name, SCHEMA, buckets=2, configs=LAKE)
        produce_json(lake_broker, name, range(0, 1500), 2)
        tier(lake_broker, name)
        produce_json(lake_broker, name, range(1500, 1800), 2)
        expected = kafka_rows(lake_broker, name)
        url = lake_broker.flight_url

        df = fluvial.spark.read_table(spark, name, url=url, include_metadata=True)
        via_source = read(spark, lake_broker, name, includeMetadata="true")
        assert fields(df) == fields(via_source)
        # The lake side is Spark's Parquet scan, not the Python data source.
        assert "parquet" in df._jdf.queryExecution().executedPlan().toString().lower()
        got = sorted(({k: r[k] for k in ("id", "city", "amount", "_bucket", "_offset")} for r in rows(df)),
                     key=lambda r: (r["_bucket"], r["_offset"]))
        assert got == expected
        assert sort_rows(df.toArrow(), ["_bucket", "_offset"]) == sort_rows(via_source.toArrow(), ["_bucket", "_offset"])
        assert "BatchScan fluvial" in df._jdf.queryExecution().executedPlan().toString()  # the tail's tasks
        # the tail read on the driver instead (a local relation): the same
        tasks = fluvial.spark.read_table(spark, name, url=url, include_metadata=True, driver_tail_rows=10_000)
        assert "BatchScan fluvial" not in tasks._jdf.queryExecution().executedPlan().toString()
        assert fields(tasks) == fields(via_source)
        assert sort_rows(tasks.toArrow(), ["_bucket", "_offset"]) == sort_rows(via_source.toArrow(), ["_bucket", "_offset"])

        # projection and a filter on a column not returned
        df = fluvial.spark.read_table(spark, name, url=url, columns=["id"],
                                      filter="amount >= 500 AND city != 'Lima'")
        assert fields(df) == [("id", "bigint")]
        want = sorted(r["id"] for r in expected if r["amount"] >= 500 and r["city"] not in (None, "Lima"))
        assert sorted(r["id"] for r in rows(df)) == want
        from pyspark.sql import functions as F
        df = fluvial.spark.read_table(spark, name, url=url, columns=["id", "_change"], filter=F.col("_offset") < 10)
        assert sorted(r["id"] for r in rows(df)) == sorted(r["id"] for r in expected if r["_offset"] < 10)
        assert {r["_change"] for r in rows(df)} == {0}

        assert fluvial.spark.read_table(spark, name, url=url, source="lake").count() == 1500
        # reads from offsets go through format("fluvial"): same rows
        part = fluvial.spark.read_table(spark, name, url=url, columns=["_bucket", "_offset"],
                                        startingOffsets='{"0": 100, "1": 0}', endingOffsets='{"0": 500, "1": 50}')
        assert sorted((r["_bucket"], r["_offset"]) for r in rows(part)) == \
            [(0, o) for o in range(100, 500)] + [(1, o) for o in range(50)]
        part = fluvial.spark.read_table(spark, name, url=url, columns=["id"], filter="amount >= 500 AND _bucket = 1",
                                        startingOffsets='{"0": 0, "1": 10}')
        assert sorted(r["id"] for r in rows(part)) == \
            sorted(r["id"] for r in expected if r["amount"] >= 500 and r["_bucket"] == 1 and r["_offset"] >= 10)
        with pytest.raises(Exception, match="no column"):
            fluvial.spark.read_table(spark, name, url=url, columns=["nope"])


def test_read_table_casts_lake_types_to_the_source_schema(spark, lake_broker):
    """Narrow integers (int32 in the lake), millisecond timestamps (microseconds in the lake),
    dates, decimals: the same columns and values as format("fluvial")."""
    import datetime as dt
    import decimal

    schema = pa.schema([pa.field("id", pa.int64(), False), ("small", pa.int16()), ("tiny", pa.int8()),
                        ("at", pa.timestamp("ms", tz="UTC")), ("local", pa.timestamp("ms")), ("day", pa.date32()),
                        ("price", pa.decimal128(10, 2)), ("u", pa.uint32()), ("tags", pa.list_(pa.string()))])
    name = f"rtt-{uuid.uuid4().hex[:8]}"

    def batch(lo: int, hi: int) -> pa.Table:
        ids = list(range(lo, hi))
        base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        return pa.table({
            "id": ids, "small": [i % 30000 - 15000 for i in ids], "tiny": [None if i % 7 == 0 else i % 100 for i in ids],
            "at": [base + dt.timedelta(milliseconds=i * 1234) for i in ids],
            "local": [dt.datetime(2026, 5, 1) + dt.timedelta(milliseconds=i) for i in ids],
            "day": [dt.date(2026, 1, 1) + dt.timedelta(days=i % 400) for i in ids],
            "price": [decimal.Decimal(i) / 100 for i in ids], "u": [4_000_000_000 + i for i in ids],
            "tags": [["a", str(i)] if i % 3 else None for i in ids]}, schema=schema)

    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, schema, buckets=2, configs=LAKE)
        t.append(batch(0, 800))
        tier(lake_broker, name)
        t.append(batch(800, 1000))
        via_source = read(spark, lake_broker, name)
        for tail_rows in (0, 1000):  # the tail by format("fluvial") tasks, then on the driver
            df = fluvial.spark.read_table(spark, name, url=lake_broker.flight_url, driver_tail_rows=tail_rows)
            assert fields(df) == fields(via_source)
            assert sort_rows(df.toArrow(), ["id"]) == sort_rows(via_source.toArrow(), ["id"])
        assert df.count() == 1000


def test_read_table_of_pk_and_plain_tables_goes_through_the_source(spark, lake_broker):
    schema = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.string())])
    name = f"rtp-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, schema, buckets=2, primary_key=["k"], configs=LAKE)
        t.upsert(pa.table({"k": list(range(100)), "v": ["a"] * 100}, schema=schema))
        tier(lake_broker, name)
        t.upsert(pa.table({"k": list(range(50, 120)), "v": ["b"] * 70}, schema=schema))
        expected = sort_rows(t.lookup([{"k": k} for k in range(200)]), ["k"])
        got = fluvial.spark.read_table(spark, name, url=lake_broker.flight_url, source="union")
        assert sort_rows(got.toArrow(), ["k"]) == expected
        plain = f"rtn-{uuid.uuid4().hex[:8]}"
        client.create_table(plain, SCHEMA, buckets=1)
        produce_json(lake_broker, plain, range(0, 40), 1)
        assert fluvial.spark.read_table(spark, plain, url=lake_broker.flight_url, columns=["id"]).count() == 40


def test_read_table_after_a_column_is_added(spark, lake_broker):
    """Lake files written before a column existed read it as null through Spark's reader."""
    name = f"rte-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, SCHEMA, buckets=2, kafka_format="avro", configs=LAKE)
        t.append(pa.table({"id": list(range(100)), "city": ["Oslo"] * 100, "amount": [1.0] * 100}, schema=SCHEMA))
        tier(lake_broker, name)
        add_nullable_note_column(lake_broker, name)
        t = client.table(name)
        t.append(pa.table({"id": list(range(100, 150)), "city": ["Lima"] * 50, "amount": [2.0] * 50,
                           "note": [f"n{i}" for i in range(50)]}))
        tier(lake_broker, name)          # the lake table gains the column; old files lack it
        t.append(pa.table({"id": [150], "city": ["Pune"], "amount": [3.0], "note": ["live"]}))
        df = fluvial.spark.read_table(spark, name, url=lake_broker.flight_url, columns=["id", "note"])
        assert fields(df) == fields(read(spark, lake_broker, name, columns="id,note"))
        notes = {r["id"]: r["note"] for r in rows(df)}
        assert len(notes) == 151 and df.count() == 151
        assert all(notes[i] is None for i in range(100))
        assert [notes[i] for i in range(100, 151)] == [f"n{i}" for i in range(50)] + ["live"]
        only_new = fluvial.spark.read_table(spark, name, url=lake_broker.flight_url, columns=["id"],
                                            filter="note IS NOT NULL", source="lake")
        assert sorted(r["id"] for r in rows(only_new)) == list(range(100, 150))
