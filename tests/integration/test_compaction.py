"""Log compaction with real clients: latest value per key, offsets kept, tombstones, kill -9."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pyarrow.flight as flight
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.errors import KafkaError

from fluvial.broker.log.fault_injection import ENV_VAR, held_marker

PARTITIONS = 2


def create_compacted(bootstrap: str, topic: str, **extra: str) -> None:
    config = {"cleanup.policy": "compact", "segment.bytes": "8192", "min.cleanable.dirty.ratio": "0.01",
              "delete.retention.ms": "2000", **extra}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(15)


def produce_updates(bootstrap: str, topic: str, keys: int, rounds: int, deleted: range) -> dict:
    """Every key updated `rounds` times (librdkafka's default partitioner), then tombstones
    for `deleted`; returns (partition, key) -> (offset, value) of each key's last record."""
    latest: dict = {}

    def done(err, msg):
        assert err is None, err
        latest[(msg.partition(), msg.key())] = (msg.offset(), msg.value())

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 50})
    for r in range(rounds):
        for k in range(keys):
            p.produce(topic, key=b"key-%04d" % k, value=b"value-%04d-%02d" % (k, r), on_delivery=done)
        p.poll(0)
    for k in deleted:
        p.produce(topic, key=b"key-%04d" % k, value=None, on_delivery=done)
    assert p.flush(60) == 0
    return latest


def consume_all(bootstrap: str, topic: str) -> dict:
    """(partition, key) -> [(offset, value)] of everything from offset 0 to the end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, i, 0) for i in range(PARTITIONS)])
    got: dict = {}
    eof: set = set()
    deadline = time.monotonic() + 60
    while len(eof) < PARTITIONS and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                eof.add(m.partition())
            continue
        eof.discard(m.partition())
        got.setdefault((m.partition(), m.key()), []).append((m.offset(), m.value()))
    c.close()
    assert len(eof) == PARTITIONS, "did not reach the end"
    return got


def compact_now(broker, topic: str) -> list[dict]:
    res = subprocess.run([sys.executable, "-m", "fluvial.broker", "table", "compact", topic, "--url",
                          broker.flight_url], capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    assert b"records" in res.stdout
    client = flight.connect(broker.flight_url)
    try:
        results = list(client.do_action(flight.Action("compact", json.dumps({"table": topic}).encode())))
    finally:
        client.close()
    return json.loads(results[0].body.to_pybytes())


def test_compaction_with_confluent_and_java_consumers(fresh_broker, java_tools, topic_name):
    # Only the forced cleanings run (the background cleaner would remove the tombstones once
    # delete.retention.ms has passed, while the Java consumers start).
    broker = fresh_broker("--log-cleaner-backoff-ms", "3600000")
    create_compacted(broker.bootstrap, topic_name)
    keys, rounds, deleted = 120, 6, range(0, 120, 10)
    latest = produce_updates(broker.bootstrap, topic_name, keys, rounds, deleted)
    before = consume_all(broker.bootstrap, topic_name)
    assert sum(len(v) for v in before.values()) == keys * rounds + len(deleted)

    compact_now(broker, topic_name)
    after = consume_all(broker.bootstrap, topic_name)
    # One record per key, at the offset it was written at, with its last value; tombstones kept.
    assert {k: v for k, v in after.items()} == {k: [ov] for k, ov in latest.items()}
    assert sum(1 for v in after.values() if v[0][1] is None) == len(deleted)

    # Apache Kafka's console consumer reads the compacted log from offset 0.
    for partition in range(PARTITIONS):
        expected = sorted((off, key, val) for (p, key), [(off, val)] in after.items() if p == partition)
        cmd = java_tools.java_tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", broker.bootstrap,
            "--topic", topic_name, "--partition", str(partition), "--offset", "earliest",
            "--max-messages", str(len(expected)), "--timeout-ms", "30000",
            "--property", "print.key=true", "--property", "print.offset=true", "--property", "key.separator=|")
        res = subprocess.run(cmd, capture_output=True, timeout=120)
        assert res.returncode == 0, res.stderr.decode()[-3000:]
        lines = [line for line in res.stdout.decode().splitlines() if line.startswith("Offset:")]
        want = [f"Offset:{off}|{key.decode()}|{'null' if val is None else val.decode()}" for off, key, val in expected]
        assert lines == want

    # After delete.retention.ms the next cleaning removes the tombstones; nothing else changes.
    time.sleep(2.5)
    compact_now(broker, topic_name)
    final = consume_all(broker.bootstrap, topic_name)
    assert final == {k: [ov] for k, ov in latest.items() if ov[1] is not None}

    # New updates after cleaning are appended after the old end, and cleaned in turn.
    more = produce_updates(broker.bootstrap, topic_name, 5, 2, range(0))
    compact_now(broker, topic_name)
    assert consume_all(broker.bootstrap, topic_name) == {
        **{k: [ov] for k, ov in latest.items() if ov[1] is not None}, **{k: [ov] for k, ov in more.items()}}


def test_keyless_records_are_refused_per_record(broker, topic_name):
    create_compacted(broker.bootstrap, topic_name)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50, retries=0, enable_idempotence=False)
    good = p.send(topic_name, key=b"k", value=b"v", partition=0)
    bad = p.send(topic_name, value=b"no key", partition=0)
    p.flush()
    with pytest.raises(KafkaError) as info:
        bad.get(10)
    assert "INVALID_RECORD" in repr(info.value) or "InvalidRecord" in repr(info.value)
    with pytest.raises(KafkaError):
        good.get(10)  # the same batch: refused whole, nothing written
    assert p.send(topic_name, key=b"k", value=b"v2", partition=0).get(10).offset == 0
    p.close()
    # confluent-kafka sees the same error code.
    errors = []
    c = Producer({"bootstrap.servers": broker.bootstrap})
    c.produce(topic_name, value=b"no key", partition=1, on_delivery=lambda err, msg: errors.append(err))
    c.flush(10)
    assert errors and errors[0] is not None and errors[0].code() == 87  # INVALID_RECORD
    # The table API refuses keyless rows too; rows with keys go in.
    import pyarrow as pa

    import fluvial.client as fc
    with fc.connect(broker.flight_url) as client:
        table = client.table(topic_name)
        with pytest.raises(fc.FluvialError) as info:
            table.append(pa.table({"value": [b"a", b"b"]}), bucket=0)
        assert "without key" in str(info.value)
        table.append(pa.table({"_key": [b"k1"], "value": [b"a"]}), bucket=0)


def test_the_background_cleaner_compacts_closed_segments(fresh_broker, topic_name):
    broker = fresh_broker("--log-cleaner-backoff-ms", "200")
    create_compacted(broker.bootstrap, topic_name)
    latest = produce_updates(broker.bootstrap, topic_name, 100, 8, range(0))
    # The closed segments are cleaned without being asked; the active one keeps its records.
    deadline = time.monotonic() + 30
    while True:
        got = consume_all(broker.bootstrap, topic_name)
        if sum(len(v) for v in got.values()) < 100 * 8 / 2:
            break
        assert time.monotonic() < deadline, "the background cleaner did not clean"
        time.sleep(0.5)
    assert {k: v[-1] for k, v in got.items()} == latest


def test_kill_9_during_cleaning_loses_nothing(fresh_broker, tmp_path, topic_name, monkeypatch):
    faults = tmp_path / "fsync-faults"
    monkeypatch.setenv(ENV_VAR, str(faults))
    broker = fresh_broker("--log-cleaner-backoff-ms", "3600000")
    create_compacted(broker.bootstrap, topic_name, **{"delete.retention.ms": "600000"})
    latest = produce_updates(broker.bootstrap, topic_name, 200, 5, range(0, 200, 7))
    # The cleaner stops at the fsync of its first cleaned copy; the broker is killed there.
    faults.write_text("hold .cleaned\n")
    threading.Thread(target=lambda: _ignore_errors(compact_now, broker, topic_name), daemon=True).start()
    deadline = time.monotonic() + 30
    while not held_marker(faults).exists():
        assert time.monotonic() < deadline, "cleaning never reached its fsync"
        time.sleep(0.05)
    assert list((broker.data_dir / "log").glob(f"{topic_name}-*/*.cleaned"))
    broker.kill9()
    faults.write_text("")
    broker.start()
    everything = consume_all(broker.bootstrap, topic_name)
    assert {k: v[-1] for k, v in everything.items()} == latest
    assert not list((broker.data_dir / "log").glob(f"{topic_name}-*/*.cleaned"))
    compact_now(broker, topic_name)
    assert consume_all(broker.bootstrap, topic_name) == {k: [ov] for k, ov in latest.items()}


def _ignore_errors(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the broker is killed under it
        pass


def test_typed_json_table_compaction_with_tombstones(broker, topic_name):
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "state": {"type": "string"}},
              "required": ["id", "state"]}
    create_compacted(broker.bootstrap, topic_name, **{"fluvial.value.format": "json",
                                                      "fluvial.value.schema": json.dumps(schema),
                                                      "delete.retention.ms": "600000"})
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = JSONSerializer(json.dumps(schema), sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    de = JSONDeserializer(json.dumps(schema))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    latest: dict = {}

    def done(err, msg):
        assert err is None, err
        latest[(msg.partition(), msg.key())] = (msg.offset(), msg.value())

    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for r in range(4):
        for k in range(60):
            p.produce(topic_name, key=b"k%03d" % k, value=ser({"id": k, "state": f"s{r}"}, ctx), on_delivery=done)
        p.poll(0)
    for k in range(0, 60, 6):
        p.produce(topic_name, key=b"k%03d" % k, value=None, on_delivery=done)
    assert p.flush(60) == 0
    compact_now(broker, topic_name)
    after = consume_all(broker.bootstrap, topic_name)
    assert {k: [(o, None if v is None else de(v, ctx))] for k, (o, v) in latest.items()} == {
        k: [(o, None if v is None else de(v, ctx))] for k, [(o, v)] in after.items()}
    assert sum(1 for [(_, v)] in after.values() if v is None) == 10
    assert all(de(v, ctx)["state"] == "s3" for [(_, v)] in after.values() if v is not None)


def test_compacted_tables_stay_local_with_remote_storage_on_by_default(fresh_broker, topic_name):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource

    broker = fresh_broker("--remote-storage-enable", "true", "--log-cleaner-backoff-ms", "3600000")
    create_compacted(broker.bootstrap, topic_name)
    client = flight.connect(broker.flight_url)
    try:
        status = json.loads(list(client.do_action(flight.Action(
            "status", json.dumps({"name": topic_name}).encode())))[0].body.to_pybytes())
    finally:
        client.close()
    assert "remote_storage_enabled" in json.dumps(status) and '"remote_storage_enabled": true' not in json.dumps(status)
    # A table that tiers cannot become compacted; an explicit remote.storage.enable is refused too.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name + "-r", 1, 1)])[topic_name + "-r"].result(15)
    change = ConfigResource(ConfigResource.Type.TOPIC, topic_name + "-r", set_config={"cleanup.policy": "compact"})
    with pytest.raises(KafkaException) as info:
        list(admin.alter_configs([change]).values())[0].result(15)
    assert info.value.args[0].name() == "INVALID_CONFIG"
    with pytest.raises(KafkaException) as info:
        create_compacted(broker.bootstrap, topic_name + "-x", **{"remote.storage.enable": "true"})
    assert info.value.args[0].name() == "INVALID_CONFIG"


def test_table_api_scans_of_a_compacted_table(fresh_broker, topic_name):
    """Native scans (and so Spark and lake tiering) read the records left, across the gaps."""
    import fluvial.client as fc

    broker = fresh_broker("--log-cleaner-backoff-ms", "3600000")
    create_compacted(broker.bootstrap, topic_name)
    latest = produce_updates(broker.bootstrap, topic_name, 50, 5, range(0))
    compact_now(broker, topic_name)
    kept = sorted((p, o, k) for (p, k), (o, _) in latest.items())
    with fc.connect(broker.flight_url) as client:
        table = client.table(topic_name)
        rows = table.scan(columns=["_bucket", "_offset", "_key"]).to_arrow()
        assert sorted(zip(*(rows.column(c).to_pylist() for c in ("_bucket", "_offset", "_key")))) == kept
        # Start and end inside gaps of bucket 0.
        offsets = [o for p, o, _ in kept if p == 0]
        start, end = offsets[2] - 1, offsets[-3] - 1
        part = table.scan(columns=["_offset"], start={0: start}, end={0: end}, buckets=[0]).to_arrow()
        assert part.column("_offset").to_pylist() == [o for o in offsets if start <= o < end]
