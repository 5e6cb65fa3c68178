"""Apache Kafka's Java producer (default partitioner, idempotence on) writes a primary-key
table with JSON keys: every key lands in the bucket the broker expects, updates merge."""
from __future__ import annotations

import json
import subprocess

import pyarrow as pa
import pytest

from fluvial.client import connect
from fluvial.kv.bucketing import bucket_of

pytestmark = pytest.mark.java

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), pa.field("name", pa.string()), pa.field("n", pa.int64())])


def test_java_console_producer_upserts_by_key(broker, java_tools, topic_name):
    with connect(broker.flight_url) as client:
        t = client.create_table(topic_name, SCHEMA, buckets=4, kafka_format="json", primary_key=["id"])
    lines = []
    for round_ in range(3):
        for i in range(40):
            key = json.dumps({"id": i}, separators=(",", ":"))
            lines.append(f"{key}|" + json.dumps({"id": i, "name": f"r{round_}", "n": round_ * 100 + i}))
    cmd = java_tools.java_tool("org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", broker.bootstrap,
                               "--topic", topic_name, "--property", "parse.key=true", "--property", "key.separator=|",
                               "--producer-property", "acks=all", "--producer-property", "enable.idempotence=true")
    res = subprocess.run(cmd, input=("\n".join(lines) + "\n").encode(), capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert b"ERROR" not in res.stderr, res.stderr.decode()[-3000:]
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        rows = t.lookup(pa.table({"id": pa.array(range(40), pa.int64())})).to_pylist()
        assert sorted(rows, key=lambda r: r["id"]) == [{"id": i, "name": "r2", "n": 200 + i} for i in range(40)]
        # Each bucket holds exactly the keys the Java partitioner sent to it: +I, then -U/+U twice.
        hw = [o.high_watermark for o in t.offsets()]
        per_bucket = [0] * 4
        for i in range(40):
            per_bucket[bucket_of(json.dumps({"id": i}, separators=(",", ":")).encode(), 4)] += 5
        assert hw == per_bucket


def test_java_consumer_moves_past_a_retract_tables_empty_batch(broker, java_tools, topic_name):
    # The seed's ordering (3): the last write (-U of an earlier row) emits nothing visible,
    # so the changelog ends with a batch of only logged input rows, fetched as an empty batch.
    with connect(broker.flight_url) as client:
        t = client.create_table(topic_name, pa.schema([pa.field("id", pa.int64(), False), ("level", pa.int64()),
                                                       ("attr", pa.string())]),
                                kafka_format="json", primary_key=["id"], merge_engine="retract")
        for change, level, attr in [("+I", 10, "a1"), ("+U", 20, "b1"), ("-U", 10, "a1")]:
            t.upsert([{"_change": change, "id": 1, "level": level, "attr": attr}])
        end = t.offsets()[0].high_watermark
    group = f"g-{topic_name}"
    for topic in (f"{topic_name}.changelog", topic_name):
        cmd = java_tools.java_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                                   broker.bootstrap, "--topic", topic, "--from-beginning", "--timeout-ms", "6000",
                                   "--group", f"{group}-{topic}", "--property", "print.headers=true")
        res = subprocess.run(cmd, capture_output=True, timeout=120)
        shown = [line for line in res.stdout.decode().splitlines() if line.strip()]
        if topic.endswith(".changelog"):
            assert [line.split("\t")[0] for line in shown] == ["fluvial.change:+I", "fluvial.change:-U",
                                                               "fluvial.change:+U"], res.stdout.decode()
        else:
            assert [line.split("\t")[0] for line in shown] == ["fluvial.change:+I", "fluvial.change:+U"]
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import AdminClient
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        request = [ConsumerGroupTopicPartitions(f"{group}-{topic}", [TopicPartition(topic, 0)])]
        committed = list(admin.list_consumer_group_offsets(request).values())[0].result(10)
        # The Java consumer's position moved past the empty batch to the log end.
        assert committed.topic_partitions[0].offset == end
