"""Union reads (lake snapshot + the broker's log after it) through the native client: every
row once, compared with a full Kafka read and with lookups; projection, filters, retention,
lake-only and log-only reads, pinned snapshots, and the refusals."""
from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from fluvial.client import connect, union
from fluvial.errors import InvalidRequestError
from tests.support.lake import lake_info_for, sort_rows, sql_catalog, tier_log_rows, tier_pk_state

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("city", pa.string()), ("amount", pa.float64()),
                    ("qty", pa.int16()), ("day", pa.date32())])
CITIES = ["Oslo", "Lima", None, "Pune"]
LAKE_CONFIGS = {"fluvial.lake.enable": "true"}


@pytest.fixture
def client(broker):
    with connect(broker.flight_url) as c:
        yield c


@pytest.fixture(params=["files", "pyiceberg"])
def lake(request, tmp_path, monkeypatch):
    """A lake in an exact state: a SQL catalog in a temporary folder, written by the test
    (tests/support/lake.py), which the `lake-info` answers point at. Tables tiered by the
    real tiering code are in test_union_read_tiered.py."""
    catalog, props = sql_catalog(tmp_path / "lake")
    tables: dict[str, object] = {}

    def info(table):
        ice = tables.get(table.name)
        if ice is None:
            return None
        # "files": the snapshot read from its metadata and data files; "pyiceberg": through the catalog
        return union.LakeInfo.from_json(lake_info_for(ice, props, with_location=request.param == "files"))

    monkeypatch.setattr(union, "lake_info", info)
    return catalog, tables, request.param


def batch(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table({"id": pa.array(ids, pa.int64()), "city": [CITIES[i % 4] for i in ids],
                     "amount": [float(i % 97) * 1.5 for i in ids], "qty": pa.array([i % 300 for i in ids], pa.int16()),
                     "day": pa.array([dt.date(2026, 1, 1) + dt.timedelta(days=i % 40) for i in ids], pa.date32())},
                    schema=SCHEMA)


def kafka_rows(broker, topic: str) -> list[dict]:
    """Every record of the topic read by a Kafka consumer, decoded from its JSON value."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    meta = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta}
    consumer.assign([TopicPartition(topic, p, 0) for p in meta])
    out, left = [], {p for p, e in ends.items() if e > 0}
    while left:
        for msg in consumer.consume(500, timeout=5):
            assert msg.error() is None, msg.error()
            row = json.loads(msg.value())
            out.append({**row, "_bucket": msg.partition(), "_offset": msg.offset()})
            if msg.offset() + 1 >= ends[msg.partition()]:
                left.discard(msg.partition())
    consumer.close()
    return out


def make_log_table(client, name: str, buckets: int = 3):
    t = client.create_table(name, SCHEMA, buckets=buckets, configs=LAKE_CONFIGS)
    for lo in range(0, 3000, 250):  # several stored batches per bucket
        t.append(batch(lo, lo + 250))
    return client.table(name)


def test_union_equals_kafka_read_also_after_retention(broker, client, lake, topic_name):
    catalog, tables, mode = lake
    t = make_log_table(client, topic_name)
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    # Two tiering rounds (the second's files out of offset order), then a live tail.
    tables[t.name] = tier_log_rows(catalog, t, {b: e // 3 for b, e in ends.items()})
    tables[t.name] = tier_log_rows(catalog, t, {b: 2 * e // 3 for b, e in ends.items()}, reverse_files=True)
    t.append(batch(3000, 3300))
    expected = kafka_rows(broker, t.name)
    assert len(expected) == 3300

    cols = ["id", "city", "amount", "qty", "day", "_bucket", "_offset"]
    scan = t.scan(columns=cols)
    assert isinstance(scan, union.UnionScan)  # lake-enabled, read from the beginning: union by default
    got = scan.to_arrow()
    log_schema = t.scan(columns=cols, source="log", end=0).to_arrow().schema
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in log_schema]
    want = [{**r, "day": dt.date.fromisoformat(r["day"]) if isinstance(r["day"], str) else r["day"]} for r in expected]
    assert got.to_pylist() == sorted(want, key=lambda r: (r["_bucket"], r["_offset"]))  # each row once, in order
    assert scan.plan.log_start == {b: 2 * e // 3 for b, e in ends.items()}
    assert (scan.plan.lake.files is not None) == (mode == "files")

    # Retention removes what is tiered and more of the log: the union still has every row.
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    cut = {b: 2 * e // 3 + 5 for b, e in ends.items()}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for fut in admin.delete_records([TopicPartition(t.name, b, o) for b, o in cut.items()]).values():
        fut.result(timeout=10)
    assert {o.bucket: o.log_start for o in t.offsets()} == cut
    log_only = t.scan(columns=cols, source="log").to_arrow()
    assert log_only.num_rows == 3300 - sum(cut.values())
    # The 5 offsets per bucket that neither side holds any more are reported, not invented.
    scan = t.scan(columns=cols, source="union")
    got = scan.to_arrow()
    lost = {(b, o) for b in cut for o in range(2 * ends[b] // 3, cut[b])}
    assert scan.plan.gaps == {b: (2 * ends[b] // 3, cut[b]) for b in cut}
    assert got.to_pylist() == sorted([r for r in want if (r["_bucket"], r["_offset"]) not in lost],
                                     key=lambda r: (r["_bucket"], r["_offset"]))


def test_projection_filters_lake_only_and_buckets(client, lake, topic_name):
    catalog, tables, mode = lake
    t = make_log_table(client, topic_name)
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    tables[t.name] = tier_log_rows(catalog, t, {b: e // 2 for b, e in ends.items()})
    full = t.scan(columns=["id", "city", "amount", "qty", "day", "_bucket", "_offset", "_timestamp", "_change"],
                  source="log").to_arrow().to_pylist()

    filters = [
        [("amount", ">=", 30.0), ("city", "!=", "Oslo")],
        [("city", "in", ["Lima", "Pune"]), ("qty", "<", 100)],
        [("city", "not in", ["Lima"])],           # nulls never pass a comparison
        [("city", "is_null", None), ("day", ">", dt.date(2026, 1, 20))],
        [("id", "=", 7)],
        [("_offset", ">=", 100), ("_timestamp", ">=", dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))],
    ]
    for f in filters:
        got = t.scan(columns=["id", "amount"], filter=f, source="union").to_arrow()
        assert got.column_names == ["id", "amount"]
        want = [r for r in full if all(_holds(r[c], op, v) for c, op, v in f)]
        assert sorted(got["id"].to_pylist()) == sorted(r["id"] for r in want), f
        assert got.num_rows == len(want)
    # system columns come from the lake too, in the table API's types
    got = t.scan(columns=["_bucket", "_offset", "_timestamp", "_change", "id"], source="union").to_arrow()
    assert got.schema == pa.schema([("_bucket", pa.int32(), False), ("_offset", pa.int64(), False),
                                    ("_timestamp", pa.timestamp("ms", tz="UTC"), False), ("_change", pa.int8(), False),
                                    ("id", pa.int64(), False)])
    assert sort_rows(got, ["_bucket", "_offset"]) == sorted(
        [{k: r[k] for k in got.column_names} for r in full], key=lambda r: (r["_bucket"], r["_offset"]))

    lake_only = t.scan(columns=["id", "_bucket", "_offset"], source="lake").to_arrow()
    assert sorted(zip(lake_only["_bucket"].to_pylist(), lake_only["_offset"].to_pylist())) == sorted(
        (r["_bucket"], r["_offset"]) for r in full if r["_offset"] < ends[r["_bucket"]] // 2)
    log_only = t.scan(columns=["id"], source="log").to_arrow()
    assert log_only.num_rows == len(full)

    one = t.scan(columns=["id", "_bucket", "_offset"], buckets=[1], start={1: 100}, end={1: ends[1] - 3}, source="union").to_arrow()
    assert one["_offset"].to_pylist() == list(range(100, ends[1] - 3)) and set(one["_bucket"].to_pylist()) == {1}


def _holds(x, op, v) -> bool:
    if op == "is_null":
        return x is None
    if op == "not_null":
        return x is not None
    if x is None:  # a comparison with null never holds
        return False
    return {"=": lambda: x == v, "!=": lambda: x != v, "<": lambda: x < v, "<=": lambda: x <= v,
            ">": lambda: x > v, ">=": lambda: x >= v, "in": lambda: x in v, "not in": lambda: x not in v}[op]()


def test_pinned_snapshot_and_nothing_tiered_yet(client, lake, topic_name):
    catalog, tables, mode = lake
    t = make_log_table(client, topic_name, buckets=2)
    with pytest.raises(union.LakeReadError, match="not lake-enabled"):
        t.scan(columns=["id"], source="union").to_arrow()  # the broker reports no lake: said clearly
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    tables[t.name] = first = tier_log_rows(catalog, t, {b: e // 4 for b, e in ends.items()})
    first_info = union.LakeInfo.from_json(lake_info_for(first, {"type": "sql", **first.catalog.properties}))
    # A later round commits; a read pinned on the first snapshot still gives every row once.
    tier_log_rows(catalog, t, {b: e // 2 for b, e in ends.items()})
    pinned = union.pin(first_info)
    assert pinned.offsets == {b: e // 4 for b, e in ends.items()}
    scan = t.scan(columns=["id", "_bucket", "_offset"], source="union")
    scan_plan = union.UnionPlan(pinned)
    for o in t.offsets():
        scan_plan.log_start[o.bucket], scan_plan.log_end[o.bucket] = pinned.end(o.bucket), o.high_watermark
    scan._plan = lambda: scan_plan
    got = scan.to_arrow()
    assert got.num_rows == 3000 and len(set(got["id"].to_pylist())) == 3000


def test_refusals(client, lake, topic_name):
    catalog, tables, mode = lake
    t = make_log_table(client, topic_name, buckets=1)
    tables[t.name] = tier_log_rows(catalog, t, {0: 100})
    with pytest.raises(ValueError, match="source"):
        t.scan(source="lakehouse")
    with pytest.raises(union.LakeReadError, match="source='log'"):
        t.scan(columns=["_key"], source="union").to_arrow()      # the lake does not keep Kafka keys
    with pytest.raises(InvalidRequestError, match="does not fit"):
        t.scan(filter=("qty", ">", "many"), source="union")
    with pytest.raises(InvalidRequestError, match="_bucket"):
        t.scan(filter=("_bucket", "=", 0), source="union")
    with pytest.raises(union.LakeReadError, match="source='log'"):
        t.scan(start=dt.datetime(2026, 1, 1), source="union")
    # Reading from a time is a log read by default.
    assert not isinstance(t.scan(start=dt.datetime(2000, 1, 1)), union.UnionScan)


PK_SCHEMA = pa.schema([pa.field("user", pa.string(), False), pa.field("item", pa.int32(), False),
                       ("qty", pa.int64()), ("note", pa.string())])


def test_pk_union_equals_lookups(client, lake, topic_name):
    catalog, tables, mode = lake
    t = client.create_table(topic_name, PK_SCHEMA, buckets=3, primary_key=["user", "item"],
                            configs=LAKE_CONFIGS)
    users = [f"u{i}" for i in range(40)]
    t.upsert(pa.table({"user": [u for u in users for _ in range(5)],
                       "item": pa.array([i for _ in users for i in range(5)], pa.int32()),
                       "qty": [i for i in range(200)], "note": ["a"] * 200}, schema=PK_SCHEMA))
    t.delete([{"user": "u1", "item": 1}, {"user": "u2", "item": 2}])
    full = t.full_read()
    tables[t.name] = tier_pk_state(catalog, t, full.rows, full.offsets)
    # After the snapshot: updates (also partial), deletes of lake rows, new keys, re-inserts.
    t.upsert(pa.table({"user": ["u3", "u4", "new", "u1"], "item": pa.array([3, 0, 1, 1], pa.int32()),
                       "qty": [-3, -4, 99, 11], "note": ["b", "b", "n", "again"]}, schema=PK_SCHEMA))
    t.upsert(pa.table({"user": ["u5"], "item": pa.array([4], pa.int32()), "qty": [555]}), columns=["user", "item", "qty"])
    t.delete([{"user": "u6", "item": 0}, {"user": "new", "item": 1}, {"user": "u7", "item": 7}])
    t.upsert(pa.table({"user": ["u3"], "item": pa.array([3], pa.int32()), "qty": [33], "note": ["c"]},
                      schema=PK_SCHEMA))

    keys = [{"user": u, "item": i} for u in [*users, "new"] for i in range(8)]
    expected = sort_rows(t.lookup(keys), ["user", "item"])
    assert len(expected) == 200 - 2 - 1 + 1  # two deleted before, one lake row deleted after, u1/1 back
    assert t.scan().__class__.__name__ == "Scan"  # a PK table's plain scan stays its changelog
    got = t.scan(source="union").to_arrow()
    assert [(f.name, f.type) for f in got.schema] == [(f.name, f.type) for f in t.schema]
    assert sort_rows(got, ["user", "item"]) == expected

    got = t.scan(columns=["item", "qty"], filter=[("qty", ">", 10), ("note", "!=", "a")], source="union").to_arrow()
    assert sorted(got.to_pylist(), key=lambda r: (r["item"], r["qty"])) == sorted(
        [{"item": r["item"], "qty": r["qty"]} for r in expected
         if r["qty"] is not None and r["qty"] > 10 and r["note"] is not None and r["note"] != "a"],
        key=lambda r: (r["item"], r["qty"]))
    # The lake alone is the state at the snapshot.
    lake_only = t.scan(source="lake").to_arrow()
    assert sort_rows(lake_only, ["user", "item"]) == sort_rows(full.rows, ["user", "item"])
    with pytest.raises(union.LakeReadError, match="changelog"):
        t.scan(columns=["_offset", "user"], source="union")


def test_spark_lake_tasks_read_what_the_client_reads(broker, client, lake, topic_name):
    """The Spark source's lake tasks (planned and read here, without a Spark session), by
    both lake paths: the same rows as the client's lake-only read, filters applied."""
    pytest.importorskip("pyspark")
    from fluvial.spark import union as spark_union

    catalog, tables, mode = lake
    t = make_log_table(client, topic_name, buckets=2)
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    tables[t.name] = tier_log_rows(catalog, t, {b: e // 2 for b, e in ends.items()})
    tables[t.name] = tier_log_rows(catalog, t, {b: 3 * e // 4 for b, e in ends.items()})
    lake_read = spark_union.LakeRead.pin(broker.flight_url, client.describe(t.name), client, {})
    assert (lake_read.files is not None) == (mode == "files")
    target = pa.schema([pa.field("id", pa.int64(), False), pa.field("amount", pa.float64())])
    filters = [("amount", ">=", 30.0), ("city", "!=", "Oslo")]
    parts = lake_read.file_partitions(["id", "amount"], filters)
    assert len(parts) == 2   # two rounds, one data file each
    got = pa.Table.from_batches([b for p in parts for b in lake_read.read_files(p, ["id", "amount"], filters, target)],
                                schema=target)
    want = t.scan(columns=["id", "amount"], filter=filters, source="lake").to_arrow()
    assert sort_rows(got, ["id"]) == sort_rows(want, ["id"]) and want.num_rows > 0


def test_union_follow_goes_on_with_the_log(client, lake, topic_name):
    catalog, tables, mode = lake
    t = make_log_table(client, topic_name, buckets=2)
    ends = {o.bucket: o.high_watermark for o in t.offsets()}
    tables[t.name] = tier_log_rows(catalog, t, {b: e // 2 for b, e in ends.items()})
    seen: list[int] = []
    it = t.scan(columns=["id"]).follow()
    appended = False
    for got in it:
        seen += got.column("id").to_pylist()
        if len(seen) >= 3000 and not appended:
            t.append(batch(3000, 3010))   # after the union: only the followed log has these
            appended = True
        if len(seen) >= 3010:
            break
    it.close()
    assert sorted(seen) == list(range(3010))   # every row once: lake, log, then the new rows
