"""The `fluvial` tools against a running broker."""
from __future__ import annotations

import json
import subprocess
import sys


def fluvial(*args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "fluvial.broker", *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_topic_create_list_describe_alter(broker, topic_name, tmp_path):
    boot = ["--bootstrap", broker.bootstrap]
    fluvial("topic", "create", topic_name, "--partitions", "2", "--config", "retention.ms=60000", *boot)
    assert topic_name in fluvial("topic", "list", *boot).split()
    fluvial("topic", "alter", topic_name, "--partitions", "3", "--config", "retention.bytes=1000000", *boot)
    desc = json.loads(fluvial("topic", "describe", topic_name, *boot))
    assert desc["partitions"] == [0, 1, 2]


def test_topic_create_with_avro_schema_and_schema_tools(broker, topic_name, tmp_path):
    schema = tmp_path / "s.avsc"
    schema.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}))
    fluvial("topic", "create", topic_name, "--format", "avro", "--schema", str(schema), "--bootstrap", broker.bootstrap)
    reg = ["--registry", broker.http_url]
    assert f"{topic_name}-value" in fluvial("schema", "list", *reg).split()
    got = json.loads(fluvial("schema", "get", f"{topic_name}-value", *reg))
    assert json.loads(got["schema"])["name"] == "R"
    v2 = tmp_path / "s2.avsc"
    v2.write_text(json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"], "default": None}]}))
    out = json.loads(fluvial("schema", "register", f"{topic_name}-value", str(v2), *reg))
    assert out["id"] > got["id"]


def test_group_list_describe_reset(broker, topic_name):
    from kafka import KafkaConsumer, KafkaProducer

    prod = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(10):
        prod.send(topic_name, f"v{i}".encode(), partition=0)
    prod.flush()
    prod.close()
    group = f"g-{topic_name}"
    cons = KafkaConsumer(topic_name, bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
                         auto_offset_reset="earliest", consumer_timeout_ms=5000)
    seen = [m for m in cons]
    assert len(seen) == 10
    cons.commit()
    cons.close()
    boot = ["--bootstrap", broker.bootstrap]
    assert group in fluvial("group", "list", *boot).split()
    desc = json.loads(fluvial("group", "describe", group, *boot))
    assert desc["offsets"] == {f"{topic_name}-0": 10}
    out = json.loads(fluvial("group", "reset-offsets", group, "--topic", topic_name, "--to-offset", "3", *boot))
    assert out == {f"{topic_name}-0": 3}
    out = json.loads(fluvial("group", "reset-offsets", group, "--topic", topic_name, "--to-earliest", *boot))
    assert out == {f"{topic_name}-0": 0}
    assert json.loads(fluvial("group", "describe", group, *boot))["offsets"] == {f"{topic_name}-0": 0}
