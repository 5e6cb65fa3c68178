"""Spark (local[2], one session for the module) reads and writes Fluvial through its Kafka source and format("fluvial")."""
from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time
import uuid

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'pyspark>=4.0')")

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from confluent_kafka.schema_registry import SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

import fluvial.client as fc  # noqa: E402
import fluvial.spark  # noqa: E402
from fluvial.spark.source import read_scan_stats  # noqa: E402
from tests.support.broker_process import BrokerProcess, free_port  # noqa: E402
from tests.unit.test_schema_codecs import SCHEMA20, make_record  # noqa: E402

RECORDS = 100_000


def native(spark, broker, table: str, **options):
    reader = spark.read.format("fluvial").option("url", broker.flight_url).option("table", table)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def kafka_batch(spark, broker, topic: str):
    return (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").option("endingOffsets", "latest").load())


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(10)


# -- the same 100,000 Avro records through both sources -----------------------------------

@pytest.fixture(scope="module")
def avro_topic(broker):
    """100,000 records of a 20-field Avro schema, produced with confluent-kafka's AvroSerializer
    into 2 partitions (record i into partition i % 2)."""
    topic = f"spark-avro-{uuid.uuid4().hex[:8]}"
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(topic, MessageField.VALUE)
    rng = random.Random(8)
    records = [make_record(rng, i) for i in range(RECORDS)]
    first = ser(records[0], ctx)  # registers <topic>-value before the topic exists: the table is typed
    create_topic(broker.bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.num.messages": 5000,
                  "queue.buffering.max.messages": 200_000})
    for i, r in enumerate(records):
        p.produce(topic, value=first if i == 0 else ser(r, ctx), partition=i % 2)
        if i % 20_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    schema_str = sr.get_latest_version(f"{topic}-value").schema.schema_str
    return topic, records, schema_str


def without_time_logical_types(schema_str: str) -> str:
    """The writer schema with time-millis/-micros read as plain int/long (Avro resolution allows
    it): Spark 4.2's from_avro gives TIME for them, which is off unless spark.sql.timeType.enabled."""
    def strip(node):
        if isinstance(node, dict):
            if node.get("logicalType") in ("time-millis", "time-micros"):
                return node["type"]
            return {k: strip(v) for k, v in node.items()}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return json.dumps(strip(json.loads(schema_str)))


def fingerprint(df) -> tuple:
    """Row count and order-free sums of two hashes of every row (maps, which Spark does not
    hash, as their sorted entries)."""
    df = df.withColumn("attrs", F.array_sort(F.map_entries("attrs")))
    cols = [F.col(c) for c in df.columns]
    return tuple(df.agg(F.count("*"), F.sum(F.xxhash64(*cols).cast("decimal(38,0)")),
                        F.sum(F.hash(*cols).cast("decimal(38,0)"))).first())


def test_kafka_source_and_native_source_give_the_same_rows_at_the_same_offsets(spark, broker, avro_topic):
    from pyspark.sql.avro.functions import from_avro

    topic, records, schema_str = avro_topic
    # Values are Confluent-framed (magic byte, 4-byte schema id): from_avro reads what follows.
    via_kafka = (kafka_batch(spark, broker, topic)
                 .select(F.col("partition").alias("bucket"), "offset",
                         from_avro(F.expr("substring(value, 6, length(value) - 5)"),
                                   without_time_logical_types(schema_str)).alias("v"))
                 .select("bucket", "offset", "v.*"))
    via_native = (native(spark, broker, topic, includeMetadata="true")
                  .withColumnRenamed("_bucket", "bucket").withColumnRenamed("_offset", "offset")
                  .drop("_timestamp", "_change"))
    assert via_native.columns[:20] == [f["name"] for f in SCHEMA20["fields"]]
    columns = ["bucket", "offset", *[f["name"] for f in SCHEMA20["fields"]]]
    # The same multiset of rows: count and order-free sums of two row hashes, one pass each.
    kafka_print = fingerprint(via_kafka.select(columns))
    assert kafka_print[0] == RECORDS
    assert fingerprint(via_native.select(columns)) == kafka_print
    # ...and both are what was produced: record i at offset i // 2 of partition i % 2.
    sample = [0, 1, 2, 777, 54_321, RECORDS - 1]
    rows = {(r["bucket"], r["offset"]): r for r in via_native.where(
        F.col("offset").isin([i // 2 for i in sample])).select("bucket", "offset", "id", "name", "amount").collect()}
    for i in sample:
        row = rows[(i % 2, i // 2)]
        assert (row["id"], row["name"], row["amount"]) == (records[i]["id"], records[i]["name"], records[i]["amount"])


def test_columns_option_and_a_user_schema_read_only_those_columns(spark, broker, avro_topic, tmp_path):
    topic, records, _ = avro_topic
    two = native(spark, broker, topic, columns="id,name", scanStatsDir=str(tmp_path / "two"))
    assert two.columns == ["id", "name"]
    got = two.where("id = %d" % records[4242]["id"]).collect()
    assert [tuple(r) for r in got] == [(records[4242]["id"], records[4242]["name"])]
    by_schema = (spark.read.format("fluvial").option("url", broker.flight_url).option("table", topic)
                 .schema("name STRING, day DATE").load())
    assert by_schema.columns == ["name", "day"]
    assert by_schema.count() == RECORDS
    # Only the two columns crossed the wire: far fewer bytes than the whole rows.
    native(spark, broker, topic, columns="id,name", scanStatsDir=str(tmp_path / "narrow")).count()
    native(spark, broker, topic, scanStatsDir=str(tmp_path / "all")).count()
    narrow = sum(s["stats"]["bytes_sent"] for s in read_scan_stats(str(tmp_path / "narrow")))
    full = sum(s["stats"]["bytes_sent"] for s in read_scan_stats(str(tmp_path / "all")))
    assert 0 < narrow < 0.25 * full, (narrow, full)


def test_offset_ranges_and_split_partitions(spark, broker, avro_topic):
    topic, records, _ = avro_topic
    df = native(spark, broker, topic, columns="_bucket,_offset,id", startingOffsets='{"0": 10, "1": -2}',
                endingOffsets=json.dumps({topic: {"0": 20, "1": 5}}))
    rows = sorted(tuple(r) for r in df.collect())
    assert rows == sorted([(0, o, records[2 * o]["id"]) for o in range(10, 20)]
                          + [(1, o, records[2 * o + 1]["id"]) for o in range(5)])
    split = native(spark, broker, topic, columns="_offset", maxRecordsPerPartition="7000")
    assert split.rdd.getNumPartitions() == 2 * 8
    offsets = split.agg(F.count("*"), F.countDistinct("_offset"), F.min("_offset"), F.max("_offset")).first()
    assert tuple(offsets) == (RECORDS, RECORDS // 2, 0, RECORDS // 2 - 1)


def test_kafka_source_offsets_by_timestamp(spark, broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    base = 1_700_000_000_000
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(100):
        p.produce(topic_name, value=f"v{i}".encode(), partition=0, timestamp=base + i * 1000)
    assert p.flush(30) == 0
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
          .option("subscribe", topic_name).option("startingTimestamp", str(base + 50_000))
          .option("endingOffsetsByTimestamp", json.dumps({topic_name: {"0": base + 80_500}})).load())
    assert [r.offset for r in df.select("offset").orderBy("offset").collect()] == list(range(50, 81))


# -- writes -------------------------------------------------------------------------------

def test_spark_writes_with_the_kafka_sink_and_kafka_clients_read_it(spark, broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 2)
    df = spark.range(5000).select(F.format_string("k%d", (F.col("id") % 50)).alias("key"),
                                  F.format_string("value %d", "id").alias("value"))
    df.write.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic_name).save()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "spark-sink", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, p, 0) for p in range(2)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 5000 and time.monotonic() < deadline:
        got += [m for m in c.consume(1000, timeout=1) if m.error() is None]
    c.close()
    assert sorted(m.value().decode() for m in got) == sorted(f"value {i}" for i in range(5000))
    assert {m.key().decode() for m in got} == {f"k{i}" for i in range(50)}
    # The same records through the native client.
    raw = fc.connect(broker.flight_url).table(topic_name).scan(columns=["_key", "value"]).to_arrow()
    assert sorted(v.decode() for v in raw.column("value").to_pylist()) == sorted(f"value {i}" for i in range(5000))


def test_spark_writes_with_format_fluvial_and_kafka_and_native_clients_read_it(spark, broker, topic_name, tmp_path):
    client = fc.connect(broker.flight_url)
    client.create_table(topic_name, pa.schema([("id", pa.int64()), ("city", pa.string()),
                                               ("at", pa.timestamp("ms", tz="UTC"))]), buckets=2,
                        kafka_format="avro")
    df = spark.range(20_000).select("id", F.element_at(F.array(F.lit("Lyon"), F.lit("Oslo")),
                                                       (F.col("id") % 2 + 1).cast("int")).alias("city"),
                                    F.timestamp_millis(F.col("id") * 1000).alias("at"))
    df.write.format("fluvial").option("url", broker.flight_url).option("table", topic_name).mode("append").save()
    got = client.table(topic_name).scan(columns=["id", "city", "at"]).to_arrow().sort_by("id")
    assert got.column("id").to_pylist() == list(range(20_000))
    assert got.column("city").to_pylist()[:3] == ["Lyon", "Oslo", "Lyon"]
    assert got.column("at")[3].as_py() == dt.datetime(1970, 1, 1, 0, 0, 3, tzinfo=dt.timezone.utc)
    # Kafka consumers see the rows as Avro values under the registry's schema.
    de = AvroDeserializer(SchemaRegistryClient({"url": broker.http_url}))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "fluvial-sink", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, p, 0) for p in range(2)])
    values = []
    deadline = time.monotonic() + 60
    while len(values) < 20_000 and time.monotonic() < deadline:
        values += [de(m.value(), ctx) for m in c.consume(2000, timeout=1) if m.error() is None]
    c.close()
    assert sorted(v["id"] for v in values) == list(range(20_000))
    assert {v["id"]: v["at"] for v in values}[3] == dt.datetime(1970, 1, 1, 0, 0, 3, tzinfo=dt.timezone.utc)
    # Streaming writes too.
    stream = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
              .select(F.col("value").alias("id"), F.lit("Rome").alias("city"), F.col("timestamp").alias("at")))
    q = (stream.writeStream.format("fluvial").option("url", broker.flight_url).option("table", topic_name)
         .option("checkpointLocation", str(tmp_path / "checkpoint"))
         .trigger(processingTime="1 second").start())
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            rome = client.table(topic_name).scan(columns=["id"], filter=("city", "=", "Rome")).to_arrow()
            if rome.num_rows >= 1000:
                break
            time.sleep(1)
    finally:
        q.stop()
    assert rome.num_rows >= 1000
    assert sorted(rome.column("id").to_pylist())[:1000] == list(range(1000))


def test_writes_into_a_primary_key_table_upsert_by_key(spark, broker, topic_name):
    df = spark.range(1000).selectExpr("id", "id * 10 AS balance", "concat('owner ', id) AS owner")
    (df.write.format("fluvial").option("url", broker.flight_url).option("table", topic_name)
     .option("createTable", "true").option("primaryKey", "id").option("buckets", "2").mode("append").save())
    # Again with new balances for half of the keys, leaving the owners as they are.
    (spark.range(0, 1000, 2).selectExpr("id", "-1 AS balance").write.format("fluvial")
     .option("url", broker.flight_url).option("table", topic_name).mode("append").save())
    table = fc.connect(broker.flight_url).table(topic_name)
    assert table.info.kind == "primary_key"
    rows = table.lookup(pa.table({"id": [0, 1, 998, 999]})).sort_by("id").to_pydict()
    assert rows == {"id": [0, 1, 998, 999], "balance": [-1, 10, -1, 9990],
                    "owner": ["owner 0", "owner 1", "owner 998", "owner 999"]}


def test_spark_creates_a_crc32_primary_key_table_that_librdkafka_producers_fit(spark, broker, topic_name):
    import zlib

    from confluent_kafka import Consumer, TopicPartition

    df = spark.range(200).selectExpr("id", "id * 10 AS balance")
    (df.write.format("fluvial").option("url", broker.flight_url).option("table", topic_name)
     .option("createTable", "true").option("primaryKey", "id").option("buckets", "3")
     .option("bucketFunction", "crc32").mode("append").save())
    table = fc.connect(broker.flight_url).table(topic_name)
    assert table.info.configs["fluvial.bucket.function"] == "crc32"
    assert table.lookup(pa.table({"id": [0, 199]})).sort_by("id").to_pydict() == {"id": [0, 199], "balance": [0, 1990]}
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, p, 0) for p in range(3)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 200 and time.monotonic() < deadline:
        got += [m for m in c.consume(200, timeout=0.5) if m.error() is None]
    c.close()
    assert len(got) == 200
    assert all(m.partition() == zlib.crc32(m.key()) % 3 for m in got)


def test_a_changelog_shuffled_by_another_column_materializes_right_in_a_retract_table(spark, broker, topic_name):
    # The seed's join output, shuffled by `level` into 4 tasks that write at the same time:
    # each task keeps its rows' order, the table sees them interleaved.
    from tests.integration.test_pk_retract_recovery import reordered_stream
    from tests.support.changelog_join import upsert_table
    changes, _ = reordered_stream(21, 600)
    rows = [(i, op, ident, level, attr) for i, (op, ident, level, attr) in enumerate(changes)]
    df = (spark.createDataFrame(rows, "seq long, op string, id long, level long, attr string").coalesce(1)
          .repartition(4, "level").sortWithinPartitions("seq").drop("seq"))
    (df.write.format("fluvial").option("url", broker.flight_url).option("table", topic_name)
     .option("createTable", "true").option("primaryKey", "id").option("mergeEngine", "retract")
     .option("changeColumn", "op").option("buckets", "2").mode("append").save())
    table = fc.connect(broker.flight_url).table(topic_name)
    assert table.info.configs["fluvial.merge.engine"] == "retract"
    assert table.info.schema.names == ["id", "level", "attr"]
    found = table.lookup(pa.table({"id": pa.array(range(40), pa.int64())})).to_pylist()
    assert {r["id"]: (r["id"], r["level"], r["attr"]) for r in found} == upsert_table(changes)
    # The same changelog into an aggregation table: level summed, retractions subtract, so
    # each key ends with its final level (0 once deleted).
    agg = f"{topic_name}_agg"
    (df.drop("attr").write.format("fluvial").option("url", broker.flight_url).option("table", agg)
     .option("createTable", "true").option("primaryKey", "id").option("mergeEngine", "aggregation")
     .option("agg.level", "sum").option("changeColumn", "op").mode("append").save())
    summed = fc.connect(broker.flight_url).table(agg)
    assert summed.info.configs["fluvial.agg.level"] == "sum"
    final = upsert_table(changes)
    got = {r["id"]: r["level"] for r in summed.lookup(pa.table({"id": pa.array(range(40), pa.int64())})).to_pylist()}
    assert got == {i: final[i][1] if i in final else 0 for i in got} and set(final) <= set(got)
    # A change type the table does not know fails the job with the broker's reason.
    bad = spark.createDataFrame([("+X", 1, 1, "a")], "op string, id long, level long, attr string")
    with pytest.raises(Exception, match="invalid change type"):
        (bad.write.format("fluvial").option("url", broker.flight_url).option("table", topic_name)
         .option("changeColumn", "op").mode("append").save())


# -- filters ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def filter_table(broker):
    name = f"spark-filters-{uuid.uuid4().hex[:8]}"
    client = fc.connect(broker.flight_url)
    t = client.create_table(name, pa.schema([("id", pa.int64()), ("city", pa.string()), ("price", pa.float64()),
                                             ("day", pa.date32())]), buckets=2)
    rng = random.Random(3)
    cities = ["Lyon", "Oslo", "Lima", None]
    for k in range(20):  # batches with disjoint id ranges: range filters skip most of them
        ids = list(range(k * 1000, k * 1000 + 1000))
        t.append(pa.table({"id": ids, "city": [rng.choice(cities) for _ in ids],
                           "price": [rng.uniform(0, 100) for _ in ids],
                           "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % 365) for i in ids]}), bucket=k % 2)
    return name


FILTERS = [
    "id = 4242",
    "id >= 3000 AND id < 3500",
    "id BETWEEN 17000 AND 17100 AND city = 'Oslo'",
    "city IN ('Lima', 'Lyon') AND id <= 2500",
    "city NOT IN ('Lima') AND price > 90",
    "city IS NULL AND id > 18000",
    "city IS NOT NULL AND id != 17",
    "day = DATE'2024-03-01'",
    "city LIKE 'L%' AND id < 1000",
    "price = 12.5 OR id = 7",
]


@pytest.mark.skipif(not fluvial.spark._spark_at_least(__import__("pyspark").__version__, (4, 1)),
                    reason="filter pushdown needs Spark 4.1+")
@pytest.mark.parametrize("condition", FILTERS)
def test_filters_with_pushdown_equal_filters_without(spark, broker, filter_table, condition, tmp_path):
    def run(pushdown: bool) -> list:
        # A DataFrame per query (see default_push_filters on Spark 4.1/4.2).
        df = native(spark, broker, filter_table, scanStatsDir=str(tmp_path / str(pushdown)),
                    pushFilters=str(pushdown).lower())
        return sorted(tuple(r) for r in df.where(condition).collect())

    without, with_pushdown = run(False), run(True)
    assert with_pushdown == without
    assert without, f"{condition} matches nothing: the comparison would prove little"
    stats = read_scan_stats(str(tmp_path / "True"))
    if condition.startswith("id") and " OR " not in condition:
        assert sum(s["stats"]["batches_skipped"] for s in stats) >= 15, stats
        assert sum(s["stats"]["rows_sent"] for s in stats) == len(with_pushdown)
    assert sum(s["stats"]["batches_skipped"] for s in read_scan_stats(str(tmp_path / "False"))) == 0


# -- streaming ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def restartable_broker(tmp_path_factory):
    """A broker of these tests' own on fixed ports, so that it can restart under running queries."""
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data", "--flight-port", str(free_port()),
                      "--http-port", str(free_port())).start()
    yield b
    if b.alive():
        b.stop()


class Producing:
    """Writes rows 0..n-1 in small batches from a thread, pausing while the broker is down."""

    def __init__(self, write, n: int, per_batch: int = 500, pause: float = 0.05):
        self.write, self.n, self.per_batch, self.pause = write, n, per_batch, pause
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        try:
            while i < self.n:
                hi = min(i + self.per_batch, self.n)
                try:
                    self.write(i, hi)
                    i = hi
                except Exception:  # the broker is restarting: write the same rows again
                    time.sleep(0.5)
                    continue
                time.sleep(self.pause)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.done.set()

    def __enter__(self) -> "Producing":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.wait(180)


def sink_rows(spark, path: str) -> list:
    return [tuple(r) for r in spark.read.parquet(path).collect()]


def test_native_stream_survives_query_and_broker_restarts_exactly_once(spark, restartable_broker, tmp_path):
    b = restartable_broker
    name = f"stream-{uuid.uuid4().hex[:8]}"
    fc.connect(b.flight_url).create_table(name, pa.schema([("n", pa.int64())]), buckets=2)
    total = 30_000

    def write(lo: int, hi: int) -> None:
        with fc.connect(b.flight_url) as c:
            fc.Table(c, c.describe(name)).append(pa.table({"n": range(lo, hi)}), bucket=lo // 500 % 2)

    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    def start():
        stream = (spark.readStream.format("fluvial").option("url", b.flight_url).option("table", name)
                  .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "4000")
                  .option("includeMetadata", "true").load().select("_bucket", "_offset", "n"))
        return (stream.writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="500 milliseconds").start())

    with Producing(write, total) as producing:
        q = start()
        wait_for_rows(q, 3000)
        q.stop()  # a query restart
        q = start()
        wait_for_rows(q, 3000)
        b.restart()  # a broker restart under the running query
        wait_for_rows(q, 6000)
        producing.done.wait(180)
    assert not producing.errors
    q.processAllAvailable()
    progress = [p["numInputRows"] for p in q.recentProgress]
    q.stop()
    assert max(progress) <= 4000, progress  # admission control: maxRecordsPerTrigger
    rows = sink_rows(spark, sink)
    # Each stored row exactly once (an append retried across the broker restart may have
    # stored some values twice: those are two rows, at two offsets).
    assert len({(r[0], r[1]) for r in rows}) == len(rows)
    assert len(rows) == sum(o.high_watermark for o in fc.connect(b.flight_url).table(name).offsets())
    assert {r[2] for r in rows} == set(range(total))


def wait_for_rows(q, rows: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise q.exception()
        seen = sum(p["numInputRows"] for p in q.recentProgress)
        if seen >= rows:
            return
        time.sleep(0.5)
    raise AssertionError(f"the query read {seen} rows in {timeout}s, expected {rows}")


def test_kafka_stream_survives_query_and_broker_restarts_exactly_once(spark, restartable_broker, tmp_path):
    b = restartable_broker
    topic = f"kstream-{uuid.uuid4().hex[:8]}"
    create_topic(b.bootstrap, topic, 2)
    total = 20_000
    producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "enable.idempotence": True})

    def write(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            producer.produce(topic, value=str(i).encode(), partition=i % 2)
        if producer.flush(30) != 0:
            raise RuntimeError("not all records were delivered")

    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    def start():
        stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", b.bootstrap)
                  .option("subscribe", topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", "3000").load()
                  .select("partition", "offset", F.col("value").cast("string").alias("v")))
        return (stream.writeStream.format("parquet").option("path", sink).option("checkpointLocation", checkpoint)
                .trigger(processingTime="500 milliseconds").start())

    with Producing(write, total, per_batch=1000):
        q = start()
        wait_for_rows(q, 3000)
        q.stop()
        b.restart()  # the broker restarts while the query is stopped
        q = start()
        wait_for_rows(q, 3000)
    q.processAllAvailable()
    q.stop()
    rows = sink_rows(spark, sink)
    # A record the producer sent again across the broker restart is a second Kafka record;
    # the query must hold each Kafka record exactly once, and every value at least once.
    assert len({(r[0], r[1]) for r in rows}) == len(rows)
    assert {int(r[2]) for r in rows} == set(range(total))
    ends = fc.connect(b.flight_url).table(topic).offsets()
    assert len(rows) == sum(o.high_watermark for o in ends)


# -- bad input ----------------------------------------------------------------------------

def error_of(action) -> str:
    with pytest.raises(Exception) as info:
        action()
    message = str(info.value)
    # The data source's own message, not a traceback from inside the client or pyarrow.
    assert "site-packages/pyarrow" not in message and "fluvial/client" not in message, message
    return message


def test_bad_input_gives_clear_errors(spark, broker, filter_table):
    message = error_of(lambda: native(spark, broker, "no-such-table").count())
    assert "Fluvial table 'no-such-table' does not exist" in message
    message = error_of(lambda: native(spark, broker, filter_table, columns="id,nope").count())
    assert "has no column 'nope'" in message and "'city'" in message
    message = error_of(lambda: spark.read.format("fluvial").option("url", broker.flight_url)
                       .option("table", filter_table).schema("id STRING").load().count())
    assert "column 'id' is string" in message and "holds bigint" in message
    message = error_of(lambda: native(spark, broker, filter_table, startingOffsets="soon").count())
    assert "startingOffsets must be 'earliest', 'latest' or JSON" in message
    wrong = spark.range(3).select("id", F.lit(1).alias("colour"))
    message = error_of(lambda: wrong.write.format("fluvial").option("url", broker.flight_url)
                       .option("table", filter_table).mode("append").save())
    assert "does not fit Fluvial table" in message and "unknown columns ['colour']" in message
    message = error_of(lambda: spark.range(3).write.format("fluvial").option("url", broker.flight_url)
                       .option("table", filter_table).mode("overwrite").save())
    assert "append-only" in message
    bad_value = spark.range(3).select("id", F.lit("x").alias("city"), F.lit("a").alias("price"),
                                      F.lit(None).cast("date").alias("day"))
    message = error_of(lambda: bad_value.write.format("fluvial").option("url", broker.flight_url)
                       .option("table", filter_table).mode("append").save())
    assert "'price'" in message and "double" in message


# -- tiered data: format("fluvial") reads remote segments itself ---------------------------

def plain_fingerprint(df) -> tuple:
    cols = [F.col(c) for c in df.columns]
    return tuple(df.agg(F.count("*"), F.sum(F.xxhash64(*cols).cast("decimal(38,0)")),
                        F.sum(F.hash(*cols).cast("decimal(38,0)"))).first())


def test_native_source_over_tiered_data_equals_the_kafka_source(spark, tmp_path, topic_name):
    broker = BrokerProcess(tmp_path / "data", "--retention-check-interval-ms", "200", "--remote-log-manager-interval-ms", "200").start()
    try:
        schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64())])
        configs = {"remote.storage.enable": "true", "segment.bytes": str(128 * 1024), "local.retention.ms": "0"}
        with fc.connect(broker.flight_url) as client:
            table = client.create_table(topic_name, schema, buckets=2, configs=configs)
            for b in range(20):
                ids = list(range(b * 2000, (b + 1) * 2000))
                table.append(pa.table({"id": ids, "name": [f"n{i}" for i in ids],
                                       "score": [i / 7 for i in ids]}, schema=schema))
            deadline = time.monotonic() + 60
            while True:  # the early offsets of both buckets are remote only
                logs = [client.remote_log(topic_name, b, 0) for b in range(2)]
                if all(log is not None and log.local_start_offset > 0 for log in logs):
                    break
                assert time.monotonic() < deadline, "nothing was tiered"
                time.sleep(0.2)
        via_kafka = (kafka_batch(spark, broker, topic_name)
                     .select(F.col("partition").alias("bucket"), "offset",
                             F.from_json(F.col("value").cast("string"), "id long, name string, score double").alias("v"))
                     .select("bucket", "offset", "v.*"))
        via_native = (native(spark, broker, topic_name, includeMetadata="true")
                      .withColumnRenamed("_bucket", "bucket").withColumnRenamed("_offset", "offset")
                      .drop("_timestamp", "_change"))
        columns = ["bucket", "offset", "id", "name", "score"]
        kafka_print = plain_fingerprint(via_kafka.select(columns))
        assert kafka_print[0] == 40_000
        assert plain_fingerprint(via_native.select(columns)) == kafka_print
        stats_dir = tmp_path / "stats"
        narrow = native(spark, broker, topic_name, columns="id", scanStatsDir=str(stats_dir))
        assert narrow.count() == 40_000
        records = read_scan_stats(str(stats_dir))
        assert sum(r["stats"]["remote_rows_sent"] for r in records) > 0
        assert sum(r["stats"]["remote_bytes_read"] for r in records) > 0
    finally:
        broker.stop()
