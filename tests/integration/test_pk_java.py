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
