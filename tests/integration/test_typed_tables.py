"""Tables with a schema: standard serializers work unchanged, values are stored as typed columns."""
from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.errors import KafkaError

from tests.unit.test_schema_codecs import JSON_SCHEMA, SCHEMA20, make_record, normalized


def consume(bootstrap: str, topic: str, n: int, timeout: float = 60) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "typed", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got.extend(m for m in c.consume(2000, timeout=1) if m.error() is None)
    c.close()
    return got


def end_offset(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "eo"})
    hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    c.close()
    return hi


def segment_tables(broker, topic: str) -> pa.Table:
    files = sorted((broker.data_dir / "log" / f"{topic}-0").glob("*.arrows"))
    assert files, "no segment files"
    return pa.concat_tables([ipc.open_stream(f.read_bytes()).read_all() for f in files], promote_options="default")


def test_avro_serializer_10000_records_of_20_fields(broker, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    de = AvroDeserializer(sr)
    rng = random.Random(3)
    records = [make_record(rng, i) for i in range(10_000)]
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    payloads = [ser(r, ctx) for r in records]
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    errors = []
    for v in payloads:
        p.produce(topic_name, value=v, partition=0, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(60) == 0
    assert not errors

    got = consume(broker.bootstrap, topic_name, len(records))
    assert len(got) == len(records)
    assert [m.value() for m in got] == payloads  # byte-identical Avro, same writer schema id
    assert [normalized(de(m.value(), ctx)) for m in got[:500]] == [normalized(r) for r in records[:500]]

    kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000,
                       fetch_max_bytes=50 << 20, max_partition_fetch_bytes=50 << 20)
    kc.assign([KTP(topic_name, 0)])
    kc.seek(KTP(topic_name, 0), 0)
    kvals = [m.value for m in kc][: len(payloads)]
    kc.close()
    assert kvals == payloads

    async def aiokafka_values() -> list[bytes]:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.structs import TopicPartition as ATP

        ac = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                              max_partition_fetch_bytes=50 << 20)
        await ac.start()
        try:
            tp = ATP(topic_name, 0)
            ac.assign([tp])
            await ac.seek_to_beginning(tp)
            out: list[bytes] = []
            while len(out) < len(payloads):
                batch = await asyncio.wait_for(ac.getmany(tp, timeout_ms=1000), 30)
                out.extend(m.value for m in batch.get(tp, []))
            return out
        finally:
            await ac.stop()

    assert asyncio.run(aiokafka_values()) == payloads

    # The segment files hold typed columns, not opaque bytes.
    stored = segment_tables(broker, topic_name)
    assert stored.schema.field("id").type == pa.int64()
    assert stored.schema.field("flag").type == pa.bool_()
    assert stored.schema.field("score").type == pa.float64()
    assert pa.types.is_string(stored.schema.field("name").type) or pa.types.is_large_string(stored.schema.field("name").type)
    assert pa.types.is_struct(stored.schema.field("address").type)
    assert stored.column("id").to_pylist()[:100] == [r["id"] for r in records[:100]]
    assert "value" not in stored.schema.names


def test_json_serializer_round_trip(broker, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = JSONSerializer(json.dumps(JSON_SCHEMA), sr)
    de = JSONDeserializer(json.dumps(JSON_SCHEMA))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    docs = [{"id": i, "name": f"n{i}", "price": i * 0.5, "active": i % 2 == 0, "tags": ["x"] * (i % 3),
             "owner": {"name": "o", "age": None if i % 4 else i}, "note": None} for i in range(1000)]
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10})
    for d in docs:
        p.produce(topic_name, value=ser(d, ctx), partition=0)
    assert p.flush(30) == 0
    got = consume(broker.bootstrap, topic_name, len(docs))
    back = [de(m.value(), ctx) for m in got]
    for want, have in zip(docs, back):
        assert {k: v for k, v in have.items() if v is not None} == {k: v for k, v in want.items() if v is not None}


def test_create_topic_with_avro_schema_config_and_invalid_records(broker, topic_name):
    schema = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"fluvial.value.format": "avro",
                                                            "fluvial.value.schema": json.dumps(schema)})])[topic_name].result(10)
    sr = SchemaRegistryClient({"url": broker.http_url})
    latest = sr.get_latest_version(f"{topic_name}-value")
    ser = AvroSerializer(sr, json.dumps(schema), conf={"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    good = ser({"a": 1, "b": "x"}, ctx)
    assert good[1:5] == latest.schema_id.to_bytes(4, "big")

    other = sr.register_schema("unrelated-value", Schema(json.dumps(
        {"type": "record", "name": "Z", "fields": [{"name": "z", "type": "int"}]}), "AVRO"))
    bad_values = {
        "malformed bytes": good[:5] + b"\xff\xff\xff",
        # Refused by the compiled decoder, then named by the NumPy one.
        "bytes left over": good + b"\x00",
        "string not UTF-8": good[:5] + b"\x02\x02\xff",
        "non-canonical varint": good[:5] + b"\x82\x00\x02x",
        "truncated": good[:-1],
        "unknown schema id": b"\x00" + (999999).to_bytes(4, "big") + good[5:],
        "id of another subject": b"\x00" + other.to_bytes(4, "big") + good[5:],
        "no wire format": b"plain text",
    }
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=False, retries=0, linger_ms=50)
    for what, bad in bad_values.items():
        before = end_offset(broker.bootstrap, topic_name)
        futures = [prod.send(topic_name, value=good, partition=0), prod.send(topic_name, value=bad, partition=0)]
        prod.flush()
        with pytest.raises(KafkaError) as info:
            futures[1].get(10)
        assert "INVALID_RECORD" in repr(info.value) or "InvalidRecord" in repr(info.value), (what, info.value)
        assert end_offset(broker.bootstrap, topic_name) == before, f"{what}: part of a refused batch was written"
    ok = prod.send(topic_name, value=good, partition=0).get(10)
    assert ok.offset == end_offset(broker.bootstrap, topic_name) - 1
    prod.close()


def test_refusal_message_names_the_field(broker, topic_name):
    from tests.integration.test_bad_input import RawClient, produce_body
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from fluvial.protocol.errors import ErrorCode
    from fluvial.protocol.messages import ApiKey

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    sr = SchemaRegistryClient({"url": broker.http_url})
    # Registering a value schema turns the (empty, raw) table into a typed one.
    sid = sr.register_schema(f"{topic_name}-value", Schema(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}, "required": ["n"]}), "JSON"))
    assert sid > 0
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=1, key=None, value=b'{"n": 1, "s": "a"}', headers=[])
    b.append(1, timestamp=1, key=None, value=b'{"n": "not a number"}', headers=[])
    b.append(2, timestamp=1, key=None, value=b'{"s": "missing n"}', headers=[])
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, produce_body(topic_name, bytes(b.build())))
    pr = r.responses[0].partition_responses[0]
    assert pr.error_code == ErrorCode.INVALID_RECORD
    errors = {e.batch_index: e.batch_index_error_message for e in pr.record_errors}
    assert set(errors) == {1, 2}
    assert "n" in errors[1] and "n" in errors[2]
    assert end_offset(broker.bootstrap, topic_name) == 0


def test_schema_evolution(broker, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    subject = f"{topic_name}-value"
    v1 = {"type": "record", "name": "E", "fields": [{"name": "id", "type": "int"}]}
    v2 = {**v1, "fields": v1["fields"] + [{"name": "kind", "type": "string", "default": "plain"}]}
    v3 = {**v2, "fields": v2["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
    v4 = {**v3, "fields": [{"name": "id", "type": "string"}] + v3["fields"][1:]}
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    sent = []
    for version, schema, rec in [(1, v1, {"id": 1}), (2, v2, {"id": 2, "kind": "k"}),
                                 (3, v3, {"id": 3, "kind": "k", "note": "n"})]:
        ser = AvroSerializer(sr, json.dumps(schema))
        for i in range(3):
            payload = ser(rec, ctx)
            sent.append(payload)
            p.produce(topic_name, value=payload, partition=0)
        assert p.flush(10) == 0
    assert [v.version for v in [sr.get_version(subject, i) for i in (1, 2, 3)]] == [1, 2, 3]
    with pytest.raises(SchemaRegistryError) as info:
        sr.register_schema(subject, Schema(json.dumps(v4), "AVRO"))
    assert info.value.http_status_code == 409
    got = consume(broker.bootstrap, topic_name, 9)
    assert [m.value() for m in got] == sent  # each record with its own writer schema
    de = AvroDeserializer(sr)
    assert [de(m.value(), ctx)["id"] for m in got] == [1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_storage_compression_changes_keep_every_record_byte_identical(broker, topic_name):
    """Typed columns are stored zstd-compressed by default; altering fluvial.storage.compression
    applies to later appends, and batches of every codec come back as the same Avro bytes."""
    from confluent_kafka.admin import ConfigResource

    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    rng = random.Random(5)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    payloads: list[bytes] = []
    sizes = {}
    for codec in ("auto", "none", "lz4"):
        if codec != "auto":
            resource = ConfigResource("topic", topic_name, set_config={"fluvial.storage.compression": codec})
            for future in admin.alter_configs([resource]).values():
                future.result(30)
        part = [ser(make_record(rng, i), ctx) for i in range(2000)]
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
        for v in part:
            p.produce(topic_name, value=v, partition=0)
        assert p.flush(60) == 0
        payloads += part
        sizes[codec] = sum(f.stat().st_size for f in (broker.data_dir / "log" / f"{topic_name}-0").glob("*.arrows"))

    got = consume(broker.bootstrap, topic_name, len(payloads))
    assert [m.value() for m in got] == payloads
    # The uncompressed third took more disk than the zstd third before it.
    assert sizes["none"] - sizes["auto"] > 1.3 * sizes["auto"]
    assert len(segment_tables(broker, topic_name)) == len(payloads)

    resource = ConfigResource("topic", topic_name, set_config={"fluvial.storage.compression": "brotli"})
    with pytest.raises(Exception, match="fluvial.storage.compression|INVALID_CONFIG|nvalid"):
        for future in admin.alter_configs([resource]).values():
            future.result(30)


def test_zstd_delta_storage_keeps_records_byte_identical_across_clients_restart_and_scans(fresh_broker, topic_name):
    """A typed table stored with fluvial.storage.compression=zstd-delta (offsets delta-coded):
    smaller than zstd, the same Avro bytes to librdkafka and kafka-python, after a restart
    (every batch's checksum checked) too, and table API scans of a few and of all columns."""
    import fluvial.client as fc

    broker = fresh_broker()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    rng = random.Random(11)
    records = [make_record(rng, i) for i in range(6000)]
    sizes = {}
    payloads = {}
    for codec in ("zstd", "zstd-delta"):
        topic = f"{topic_name}-{codec}"
        ctx = SerializationContext(topic, MessageField.VALUE)
        payloads[codec] = [ser(r, ctx) for r in records]  # registers <topic>-value: the table is typed
        admin.create_topics([NewTopic(topic, 1, 1, config={"fluvial.storage.compression": codec})])[topic].result(30)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
        for v in payloads[codec]:
            p.produce(topic, value=v, partition=0)
        assert p.flush(60) == 0
        sizes[codec] = sum(f.stat().st_size for f in (broker.data_dir / "log" / f"{topic}-0").glob("*.arrows"))
    assert sizes["zstd-delta"] < 0.95 * sizes["zstd"]
    topic = f"{topic_name}-zstd-delta"
    expected = payloads["zstd-delta"]

    def check() -> None:
        assert [m.value() for m in consume(broker.bootstrap, topic, len(expected))] == expected
        kc = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000,
                           fetch_max_bytes=50 << 20, max_partition_fetch_bytes=50 << 20)
        kc.assign([KTP(topic, 0)])
        kc.seek(KTP(topic, 0), 0)
        assert [m.value for m in kc][: len(expected)] == expected
        kc.close()
        with fc.connect(broker.flight_url) as client:
            table = client.table(topic)
            narrow = table.scan(columns=["_offset", "name", "tags"]).to_arrow()
            assert narrow.column("_offset").to_pylist() == list(range(len(records)))
            assert narrow.column("name").to_pylist() == [r["name"] for r in records]
            assert narrow.column("tags").to_pylist() == [r["tags"] for r in records]
            full = table.scan().to_arrow()
            assert full.column("uid").to_pylist() == [r["uid"] for r in records]

    check()
    broker.restart()
    check()
