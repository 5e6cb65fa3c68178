"""The Spark tiering job end to end: Kafka producers write a log table and a primary-key table
(upserts, tombstones); `fluvial lake tier` on Spark local[2] tiers them into Iceberg; pyiceberg
and DuckDB (over the data files, no pyiceberg code) read what the broker holds; a column added
while tiering runs reaches the lake."""
from __future__ import annotations

import json
import random
import time

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed")

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient  # noqa: E402
from confluent_kafka.schema_registry.avro import AvroSerializer  # noqa: E402
from confluent_kafka.serialization import MessageField, SerializationContext  # noqa: E402

import fluvial.client as fc  # noqa: E402
from fluvial.tiering.lake.catalog import open_catalog  # noqa: E402
from fluvial.tiering.lake.job import TieringWorker  # noqa: E402
from fluvial.tiering.lake.spark_job import SparkRoundIO  # noqa: E402
from tests.support.iceberg_files import duckdb_rows  # noqa: E402

EVENT = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"}, {"name": "kind", "type": "string"}]}
EVENT_V2 = {"type": "record", "name": "Event", "fields": [
    {"name": "id", "type": "long"}, {"name": "kind", "type": "string"},
    {"name": "note", "type": ["null", "string"], "default": None}]}
ACCOUNT = {"type": "record", "name": "Account", "fields": [
    {"name": "id", "type": "long"}, {"name": "owner", "type": "string"}, {"name": "balance", "type": "long"}]}


def create(broker, name: str, schema: dict, partitions: int, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cfg = {"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(schema),
           "fluvial.lake.enable": "true", **configs}
    admin.create_topics([NewTopic(name, partitions, 1, config=cfg)])[name].result(10)


class Writer:
    def __init__(self, broker, topic: str, schema: dict, keyed: bool):
        self.sr = SchemaRegistryClient({"url": broker.http_url})
        latest = {"auto.register.schemas": False, "use.latest.version": True}
        self.value = AvroSerializer(self.sr, json.dumps(schema), conf=latest)
        self.key = AvroSerializer(self.sr, None, conf=latest) if keyed else None
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "all",
                                  "partitioner": "murmur2_random"})
        self.errors: list = []

    def send(self, row: dict | None, key: int | None = None, partition: int | None = None) -> None:
        value = None if row is None else self.value(row, SerializationContext(self.topic, MessageField.VALUE))
        kw = {"partition": partition} if partition is not None else {}
        k = self.key({"id": key}, SerializationContext(self.topic, MessageField.KEY)) if self.key else None
        self.producer.produce(self.topic, key=k, value=value,
                              on_delivery=lambda e, m: self.errors.append(e) if e else None, **kw)

    def flush(self) -> None:
        assert self.producer.flush(30) == 0
        assert self.errors == []


def lake_table(broker, client, name):
    info = client.lake_info(name)
    return open_catalog(info["catalog"]).load_table(tuple(info["identifier"]))


def test_spark_job_tiers_log_and_pk_tables(spark, fresh_broker):
    broker = fresh_broker()
    create(broker, "events", EVENT, 3)
    create(broker, "accounts", ACCOUNT, 2, **{"fluvial.primary.key": "id"})
    events = Writer(broker, "events", EVENT, keyed=False)
    for i in range(3000):
        events.send({"id": i, "kind": f"k{i % 7}"}, partition=i % 3)
    events.flush()
    accounts = Writer(broker, "accounts", ACCOUNT, keyed=True)
    rng = random.Random(3)
    state: dict[int, dict] = {}
    for step in range(1500):
        key = rng.randrange(200)
        if rng.random() < 0.2:
            accounts.send(None, key=key)
            state.pop(key, None)
        else:
            row = {"id": key, "owner": f"o{key}", "balance": step}
            accounts.send(row, key=key)
            state[key] = row
    accounts.flush()

    # Small tasks: one bucket's range is split over many tasks, so a key's changes are read by
    # different tasks and reach the reduction in any order.
    worker = TieringWorker(broker.flight_url, job="spark-test",
                           io=SparkRoundIO(spark, broker.flight_url, max_records_per_task=500))
    results = {r.table: r for r in [worker.run_once(), worker.run_once()]}
    assert worker.run_once() is None
    assert results["events"].rows == 3000

    with fc.connect(broker.flight_url) as client:
        # The log table: every row once, with its bucket and offset.
        broker_rows = client.table("events").scan(columns=["id", "kind", "_bucket", "_offset"]).to_arrow()
        expect = sorted(broker_rows.to_pylist(), key=lambda r: (r["_bucket"], r["_offset"]))
        lake = lake_table(broker, client, "events")
        got = lake.scan(selected_fields=("id", "kind", "_bucket", "_offset")).to_arrow().to_pylist()
        assert sorted(got, key=lambda r: (r["_bucket"], r["_offset"])) == expect
        catalog_db = broker.data_dir / "lake" / "catalog.db"
        assert [tuple(r.values()) for r in expect] == duckdb_rows(catalog_db, "events", "id, kind, _bucket, _offset",
                                                                  "_bucket, _offset")
        info = client.lake_info("events")
        assert info["offsets"] == {str(o.bucket): o.high_watermark for o in client.table("events").offsets()}

        # The primary-key table: the current state, by lookups and by both lake readers.
        current = sorted(state.values(), key=lambda r: r["id"])
        import pyarrow as pa
        looked_up = client.table("accounts").lookup(pa.table({"id": pa.array(range(200), pa.int64())}))
        assert sorted(looked_up.select(["id", "owner", "balance"]).to_pylist(), key=lambda r: r["id"]) == current
        lake = lake_table(broker, client, "accounts")
        assert lake.schema().identifier_field_names() == {"id"}
        assert sorted(lake.scan().to_arrow().to_pylist(), key=lambda r: r["id"]) == current
        assert duckdb_rows(catalog_db, "accounts", "id, owner, balance", "id") == [tuple(r.values()) for r in current]

        # More changes, a second round: still the current state.
        for key in range(0, 200, 3):
            if key in state and key % 2:
                accounts.send(None, key=key)
                state.pop(key)
            else:
                state[key] = {"id": key, "owner": f"p{key}", "balance": -key}
                accounts.send(state[key], key=key)
        accounts.flush()
    _force_due(broker, "accounts")
    assert worker.run_once().table == "accounts"
    current = sorted(state.values(), key=lambda r: r["id"])
    assert duckdb_rows(catalog_db, "accounts", "id, owner, balance", "id") == [tuple(r.values()) for r in current]


def _force_due(broker, name: str) -> None:
    """Alter the freshness down so the table is due now (as an operator would)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("fluvial.lake.freshness", "1ms", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)
    time.sleep(0.05)


def test_column_added_while_tiering_runs(spark, fresh_broker):
    broker = fresh_broker()
    create(broker, "evolving", EVENT, 2, **{"fluvial.lake.freshness": "100ms"})
    w1 = Writer(broker, "evolving", EVENT, keyed=False)
    for i in range(500):
        w1.send({"id": i, "kind": "old"})
    w1.flush()
    # This one reads through format("fluvial") (read mode `source`), the other test in Spark tasks.
    worker = TieringWorker(broker.flight_url, job="evolve", io=SparkRoundIO(spark, broker.flight_url, read_mode="source"),
                           poll_s=0.1)
    worker.start_thread()
    try:
        sr = SchemaRegistryClient({"url": broker.http_url})
        sr.register_schema("evolving-value", Schema(json.dumps(EVENT_V2), "AVRO"))
        w2 = Writer(broker, "evolving", EVENT_V2, keyed=False)
        for i in range(500, 800):
            w2.send({"id": i, "kind": "new", "note": f"n{i}"})
        w2.flush()
        deadline = time.monotonic() + 120
        with fc.connect(broker.flight_url) as client:
            hw = {str(o.bucket): o.high_watermark for o in client.table("evolving").offsets()}
            while client.lake_info("evolving")["offsets"] != hw:
                assert time.monotonic() < deadline, client.lake_status("evolving")
                time.sleep(0.3)
            lake = lake_table(broker, client, "evolving")
    finally:
        worker.stop()
    assert lake.schema().column_names == ["id", "kind", "_bucket", "_offset", "_timestamp", "note"]
    rows = {r["id"]: r for r in lake.scan(selected_fields=("id", "kind", "note")).to_arrow().to_pylist()}
    assert sorted(rows) == list(range(800))
    assert all(rows[i]["note"] is None for i in range(500))
    assert all(rows[i]["note"] == f"n{i}" for i in range(500, 800))


@pytest.mark.slow
def test_spark_job_killed_after_writing_files(spark, fresh_broker):
    """The Spark job (its own process, `python -m fluvial.tiering.lake`) killed after its tasks
    wrote the data files and before the commit: the next job tiers every row once."""
    import os
    import subprocess
    import sys

    from fluvial.tiering.lake.job import FAULT_ENV

    broker = fresh_broker("--lake-lease-ms", "2000")
    create(broker, "killed", EVENT, 2)
    w = Writer(broker, "killed", EVENT, keyed=False)
    for i in range(2000):
        w.send({"id": i, "kind": "k"}, partition=i % 2)
    w.flush()
    job = subprocess.run([sys.executable, "-m", "fluvial.tiering.lake", "--url", broker.flight_url,
                          "--master", "local[1]", "--rounds", "1", "--idle-exit", "60",
                          "--spark-conf", "spark.ui.enabled=false"],
                         env={**os.environ, FAULT_ENV: "after_write"}, capture_output=True, timeout=300)
    assert job.returncode == -9, job.stderr.decode()[-3000:]
    with fc.connect(broker.flight_url) as client:
        assert client.lake_info("killed")["snapshot_id"] is None
        orphans = list((broker.data_dir / "lake" / "warehouse" / "fluvial" / "killed" / "data").glob("*.parquet"))
        assert orphans, "the killed job's tasks wrote data files"
        time.sleep(2.2)  # its lease expires
        worker = TieringWorker(broker.flight_url, job="after-kill", io=SparkRoundIO(spark, broker.flight_url))
        assert worker.run_once().rows == 2000
        got = lake_table(broker, client, "killed").scan(selected_fields=("_bucket", "_offset")).to_arrow()
        keys = sorted(zip(got.column("_bucket").to_pylist(), got.column("_offset").to_pylist()))
        assert keys == sorted((b, o) for b in (0, 1) for o in range(1000))
