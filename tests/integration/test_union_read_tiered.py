"""Union reads of tables tiered by the real tiering code (the broker's coordinator and a
tiering round writing Iceberg), with Kafka producers writing: the client's and Spark's
union reads equal a full Kafka read, also after retention removed tiered segments; a
primary-key table's union read equals lookups of every key."""
from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest

from fluvial.client import connect, union
from tests.support.lake import sort_rows

pytest.importorskip("pyiceberg")
from fluvial.tiering.lake.job import TieringWorker  # noqa: E402

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("city", pa.string()), ("amount", pa.float64())])
LAKE = {"fluvial.lake.enable": "true", "fluvial.lake.freshness": "100ms"}
CITIES = ["Oslo", "Lima", None, "Pune"]


@pytest.fixture(scope="module")
def lake_broker(tmp_path_factory):
    from tests.support.broker_process import BrokerProcess

    b = BrokerProcess(tmp_path_factory.mktemp("union-broker") / "data").start()
    yield b
    b.stop()


def produce_json(broker, topic: str, ids: range, buckets: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "acks": "all"})
    for i in ids:
        p.produce(topic, json.dumps({"id": i, "city": CITIES[i % 4], "amount": i * 0.5}).encode(),
                  partition=i % buckets)
    assert p.flush(30) == 0


def kafka_rows(broker, topic: str) -> list[dict]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in parts}
    c.assign([TopicPartition(topic, p, lo) for p, (lo, hi) in ends.items()])
    out, left = [], {p for p, (lo, hi) in ends.items() if hi > lo}
    while left:
        for m in c.consume(1000, timeout=5):
            assert m.error() is None, m.error()
            out.append({**json.loads(m.value()), "_bucket": m.partition(), "_offset": m.offset()})
            if m.offset() + 1 >= ends[m.partition()][1]:
                left.discard(m.partition())
    c.close()
    return sorted(out, key=lambda r: (r["_bucket"], r["_offset"]))


def tier(broker, table: str) -> None:
    """Tiering rounds until the lake covers everything the table holds now."""
    worker = TieringWorker(broker.flight_url, job=f"test-{uuid.uuid4().hex[:6]}", tables=[table], poll_s=0.1)
    with connect(broker.flight_url) as client:
        t = client.table(table)
        want = {o.bucket: o.high_watermark for o in t.offsets()}
        for _ in range(50):
            info = t.lake_info()
            if info is not None and all(info.offsets.get(b, 0) >= e for b, e in want.items()):
                return
            if worker.run_once() is None:
                import time
                time.sleep(0.2)
    raise AssertionError(f"tiering of {table} did not catch up with {want}")


def test_union_of_tiered_log_table_equals_kafka_read(lake_broker):
    name = f"u-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, SCHEMA, buckets=3, configs=LAKE)
        produce_json(lake_broker, name, range(0, 3000), 3)
        tier(lake_broker, name)
        produce_json(lake_broker, name, range(3000, 3600), 3)   # the live tail
        t = client.table(name)
        expected = kafka_rows(lake_broker, name)
        assert len(expected) == 3600

        scan = t.scan(columns=["id", "city", "amount", "_bucket", "_offset"])
        assert isinstance(scan, union.UnionScan) and t.lake_enabled
        assert scan.to_arrow().to_pylist() == expected
        assert sum(scan.plan.log_start.values()) == 3000   # the lake served the first 3000
        assert len(scan.plan.lake.files) >= 1              # read from its files, without pyiceberg

        f = [("amount", ">=", 100.0), ("city", "!=", "Lima")]
        got = t.scan(columns=["id"], filter=f).to_arrow()
        assert sorted(got["id"].to_pylist()) == sorted(
            r["id"] for r in expected if r["amount"] >= 100 and r["city"] is not None and r["city"] != "Lima")

        # Retention deletes tiered rows (and the lake keeps them): still every row once.
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": lake_broker.bootstrap})
        lake_end = t.lake_info().offsets
        for fut in admin.delete_records([TopicPartition(name, b, o) for b, o in lake_end.items()]).values():
            fut.result(timeout=10)
        assert t.scan(columns=["id"], source="log").to_arrow().num_rows == 600
        assert t.scan(columns=["id", "city", "amount", "_bucket", "_offset"]).to_arrow().to_pylist() == expected
        assert t.scan(columns=["id"], source="lake").to_arrow().num_rows == 3000


def test_union_of_tiered_pk_table_equals_lookups(lake_broker):
    name = f"p-{uuid.uuid4().hex[:8]}"
    schema = pa.schema([pa.field("k", pa.int64(), False), ("v", pa.string()), ("n", pa.int64())])
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, schema, buckets=2, primary_key=["k"], configs=LAKE)
        t.upsert(pa.table({"k": list(range(500)), "v": [f"a{i}" for i in range(500)], "n": list(range(500))},
                          schema=schema))
        t.delete([{"k": k} for k in range(0, 500, 7)])
        tier(lake_broker, name)
        # after the lake snapshot: updates, deletes, new keys, a key deleted and written again
        t.upsert(pa.table({"k": list(range(400, 600)), "v": ["b"] * 200, "n": list(range(200))}, schema=schema))
        t.delete([{"k": k} for k in range(0, 500, 5)])
        t.upsert(pa.table({"k": [5, 10], "v": ["back", "back"], "n": [1, 2]}, schema=schema))
        expected = sort_rows(t.lookup([{"k": k} for k in range(700)]), ["k"])
        got = t.scan(source="union").to_arrow()
        assert sort_rows(got, ["k"]) == expected
        got = t.scan(columns=["k", "v"], filter=("v", "=", "b"), source="union").to_arrow()
        assert sort_rows(got, ["k"]) == [{"k": r["k"], "v": r["v"]} for r in expected if r["v"] == "b"]


def test_retract_table_tiers_its_visible_rows_to_the_lake(lake_broker):
    """A reordered join changelog into a 'retract' table: the lake table and the union read
    hold the sequential result (the merge state's logged input rows never reach the lake)."""
    from tests.integration.test_pk_retract_recovery import BATCH, batch_table, reordered_stream
    from tests.support.changelog_join import T1, upsert_table
    changes, arrivals = reordered_stream(5, 800)
    batches = (len(arrivals) + BATCH - 1) // BATCH
    name = f"r-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, T1, buckets=2, primary_key=["id"], merge_engine="retract", configs=LAKE)
        for i in range(batches // 2):
            t.upsert(batch_table(arrivals, i))
        tier(lake_broker, name)
        lake_rows = sort_rows(t.scan(source="lake").to_arrow(), ["id"])
        assert lake_rows == sort_rows(t.full_read().rows, ["id"])
        for i in range(batches // 2, batches):
            t.upsert(batch_table(arrivals, i))
        expected = sorted(({"id": i, "level": lv, "attr": a} for i, lv, a in upsert_table(changes).values()),
                          key=lambda r: r["id"])
        assert sort_rows(t.scan(source="union").to_arrow(), ["id"]) == expected
        tier(lake_broker, name)
        assert sort_rows(t.scan(source="lake").to_arrow(), ["id"]) == expected


def add_nullable_note_column(broker, name: str) -> None:
    """Evolve the table through the registry: a new version of `<name>-value` with a nullable
    `note` string."""
    import urllib.request

    url = f"{broker.http_url}/subjects/{name}-value/versions"
    with urllib.request.urlopen(url + "/latest") as resp:
        avro = json.loads(json.loads(resp.read())["schema"])
    avro["fields"].append({"name": "note", "type": ["null", "string"], "default": None})
    req = urllib.request.Request(url, data=json.dumps({"schema": json.dumps(avro)}).encode(),
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    urllib.request.urlopen(req).read()


def test_union_after_a_column_is_added(lake_broker):
    """Rows tiered before a column existed read it as null, from the lake as from the log."""
    name = f"e-{uuid.uuid4().hex[:8]}"
    with connect(lake_broker.flight_url) as client:
        t = client.create_table(name, SCHEMA, buckets=2, kafka_format="avro", configs=LAKE)
        t.append(pa.table({"id": list(range(100)), "city": ["Oslo"] * 100, "amount": [1.0] * 100}, schema=SCHEMA))
        tier(lake_broker, name)
        add_nullable_note_column(lake_broker, name)
        t = client.table(name)
        assert "note" in t.schema.names
        t.append(pa.table({"id": list(range(100, 150)), "city": ["Lima"] * 50, "amount": [2.0] * 50,
                           "note": [f"n{i}" for i in range(50)]}))
        tier(lake_broker, name)          # the lake table gains the column; old files lack it
        t.append(pa.table({"id": [150], "city": ["Pune"], "amount": [3.0], "note": ["live"]}))
        got = t.scan(columns=["id", "note"]).to_arrow()
        notes = dict(zip(got["id"].to_pylist(), got["note"].to_pylist()))
        assert len(notes) == 151 and got.num_rows == 151
        assert all(notes[i] is None for i in range(100))
        assert [notes[i] for i in range(100, 151)] == [f"n{i}" for i in range(50)] + ["live"]
        only_new = t.scan(columns=["id"], filter=("note", "not_null", None), source="lake").to_arrow()
        assert sorted(only_new["id"].to_pylist()) == list(range(100, 150))
