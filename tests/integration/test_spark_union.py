"""format("fluvial") union reads on Spark (local[2]) of tables tiered by the real tiering
round: equal to the client's union read, with projection and pushed filters, after
retention; primary-key tables give their current rows; lake-only and log-only reads."""
from __future__ import annotations

import os
import sys
import uuid

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")
pytest.importorskip("pyiceberg")

from pyspark.sql import SparkSession  # noqa: E402

import fluvial.spark  # noqa: E402
from fluvial.client import connect  # noqa: E402
from tests.integration.test_union_read_tiered import (  # noqa: E402
    LAKE, SCHEMA, kafka_rows, lake_broker, produce_json, tier,
)
from tests.support.lake import sort_rows  # noqa: E402

__all__ = ["lake_broker"]  # the module-scoped broker fixture, shared


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    # Spark's Python workers run this interpreter, so they import the code under test.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (SparkSession.builder.master("local[2]").appName("fluvial-union-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-union")))
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    fluvial.spark.register(session)
    yield session
    session.stop()


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
