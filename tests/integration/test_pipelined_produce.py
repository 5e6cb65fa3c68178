"""A producer's large requests are pipelined (the next one decoded while the previous one is
written) and still appended in the order they were sent, refused batches included."""
from __future__ import annotations

import json
import random
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey
from tests.integration.test_bad_input import RawClient, produce_body

from tests.integration.test_typed_tables import consume
from tests.unit.test_schema_codecs import SCHEMA20, make_record


def produce_in_bursts(bootstrap: str, topic: str, values: list[bytes], acks: str, burst_unit: int = 1) -> list:
    """Produce ``values`` in bursts (so that requests of different sizes are in flight at
    once, a smaller one decoded faster than the larger one before it); the delivery report
    (offset or error) of each value, in produce order. ``burst_unit``: values per 200 B."""
    reports: list = [None] * len(values)

    def report(i: int):
        def on_delivery(err, msg) -> None:
            reports[i] = err if err is not None else msg.offset()
        return on_delivery

    p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5, "batch.size": 1_000_000,
                  "max.in.flight.requests.per.connection": 20, "enable.idempotence": False, "retries": 0})
    rng = random.Random(7)
    i = 0
    while i < len(values):
        # About 1.3 batches' worth (batch.size 1 MB), then a pause: a full batch goes out
        # at once and a smaller one 5 ms later (linger.ms), while the first is still written.
        burst = rng.randint(5_500, 7_000) * burst_unit
        for v in values[i:i + burst]:
            p.produce(topic, value=v, partition=0, on_delivery=report(i))
            i += 1
        p.poll(0)
        time.sleep(rng.choice((0.001, 0.02)))
    assert p.flush(60) == 0
    return reports


def check_in_order(bootstrap: str, topic: str, values: list[bytes], reports: list) -> None:
    acked = [(off, v) for off, v in zip(reports, values) if isinstance(off, int)]
    offsets = [off for off, _ in acked]
    # Appended in produce order: the acknowledged offsets ascend with the produce order.
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    got = consume(bootstrap, topic, len(acked))
    assert [(m.offset(), m.value()) for m in got] == acked


def test_typed_table_requests_in_flight_are_appended_in_order(broker, topic_name):
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    rng = random.Random(11)
    values = [ser(make_record(rng, i), ctx) for i in range(40_000)]
    # A few values that are not Avro of the schema: their whole batch is refused
    # (INVALID_RECORD) while the requests around it go on.
    header = values[0][:5]
    for i in (5_000, 17_000, 17_001, 26_000):
        values[i] = header + b"\x99\x99\x99"
    reports = produce_in_bursts(broker.bootstrap, topic_name, values, "all")
    refused = [i for i, r in enumerate(reports) if not isinstance(r, int)]
    assert {5_000, 17_000, 17_001, 26_000} <= set(refused)
    assert len(refused) < len(values) // 2  # only the batches holding them (about 1 MB each)
    check_in_order(broker.bootstrap, topic_name, values, reports)


def test_raw_table_requests_in_flight_are_appended_in_order(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic_name, 1, 1)]).values():
        f.result(30)
    rng = random.Random(13)
    values = [i.to_bytes(4, "big") + rng.randbytes(196) for i in range(40_000)]
    # acks=1: raw batches of 16 KB and more are converted and appended on the executor.
    reports = produce_in_bursts(broker.bootstrap, topic_name, values, "1")
    assert all(isinstance(r, int) for r in reports)
    check_in_order(broker.bootstrap, topic_name, values, reports)


@pytest.mark.parametrize("acks, records", [(-1, 2_000), (1, 2_000), (-1, 5)])
def test_typed_batch_with_wrong_crc_is_corrupt_message_and_nothing_written(broker, topic_name, acks, records):
    """A typed table's CRC is checked on the executor (before the decode), whichever way the
    batch goes there (pipelined, or appended on the loop): a mismatch is still refused with
    CORRUPT_MESSAGE, nothing is appended, and the next batch takes the next offset."""
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    rng = random.Random(17)
    values = [ser(make_record(rng, i), ctx) for i in range(records)]
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce(topic_name, value=values[0], partition=0)  # the table (typed) and offset 0
    assert p.flush(30) == 0

    def batch() -> bytearray:
        b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 24)
        for i, v in enumerate(values):
            b.append(i, timestamp=1_700_000_000_000 + i, key=None, value=v, headers=[])
        return bytearray(b.build())

    c = RawClient(broker.bootstrap)
    corrupt = batch()
    corrupt[len(corrupt) // 2] ^= 0x01  # inside a value: still decodable Avro, only the CRC tells
    for _ in range(2):  # twice in a row: the refused job does not hold up the bucket's next one
        r = c.request(ApiKey.PRODUCE, 9, dict(produce_body(topic_name, bytes(corrupt)), acks=acks))
        assert r.responses[0].partition_responses[0].error_code == ErrorCode.CORRUPT_MESSAGE
    good = c.request(ApiKey.PRODUCE, 9, dict(produce_body(topic_name, bytes(batch())), acks=acks))
    pr = good.responses[0].partition_responses[0]
    assert (pr.error_code, pr.base_offset) == (0, 1)
    c.close()
    got = consume(broker.bootstrap, topic_name, 1 + records)
    assert [m.value() for m in got] == [values[0], *values]
