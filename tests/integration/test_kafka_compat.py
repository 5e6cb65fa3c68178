"""Kafka behaviours real clients rely on: commits past the log end, fetch size limits."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest
import pyarrow.flight as flight
from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient, NewTopic

from fluvial.client.wire import AppendRequest
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_idempotence import RawClient

F = request_class(ApiKey.FETCH)


def raw_fetch(bootstrap: str, topic: str, partitions: list[int], *, max_bytes: int, partition_max_bytes: int,
              offset: int = 0) -> list[tuple[int, int]]:
    """(partition, bytes of records) of one Fetch v11 answer."""
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    partition=i, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                    partition_max_bytes=partition_max_bytes) for i in partitions])],
                forgotten_topics_data=[], rack_id="")
    c = RawClient(bootstrap)
    try:
        r = c.call(ApiKey.FETCH, 11, body)
    finally:
        c.close()
    assert all(p.error_code == 0 for p in r.responses[0].partitions)
    return [(p.partition_index, len(p.records or b"")) for p in r.responses[0].partitions]


def test_offset_commit_past_the_log_end_is_accepted(broker, topic_name):
    """Kafka accepts commits ahead of the data (tools reset groups to planned positions)."""
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, 1, 1)])
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    try:
        tp = TopicPartition(topic_name, 0, 1_000_000)
        done = c.commit(offsets=[tp], asynchronous=False)
        assert done[0].error is None
        (got,) = c.committed([TopicPartition(topic_name, 0)], timeout=10)
        assert got.offset == 1_000_000
    finally:
        c.close()
    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=f"k-{topic_name}", enable_auto_commit=False)
    try:
        from kafka.structs import OffsetAndMetadata
        k.commit({KTP(topic_name, 0): OffsetAndMetadata(5000, "", -1)})
        assert k.committed(KTP(topic_name, 0)) == 5000
    finally:
        k.close()


def test_fetch_obeys_max_bytes_and_partition_max_bytes(broker, topic_name):
    partitions = 12
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, partitions, 1)])
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, batch_size=1500, linger_ms=5)
    n = 1200
    for i in range(n):
        p.send(topic_name, value=b"%06d" % i + b"x" * 200, partition=i % partitions)
    p.flush()
    p.close()
    # Batches are ~1.5 kB: 4 kB per partition, 10 kB per response.
    sizes = raw_fetch(broker.bootstrap, topic_name, list(range(partitions)), max_bytes=10_000,
                      partition_max_bytes=4_000)
    assert sum(s for _, s in sizes) <= 10_000, sizes
    assert all(s <= 4_000 for _, s in sizes), sizes
    assert sum(1 for _, s in sizes if s) >= 2
    # Smaller limits than one batch: only the first partition returns one (larger) batch.
    sizes = raw_fetch(broker.bootstrap, topic_name, list(range(partitions)), max_bytes=500, partition_max_bytes=300)
    with_data = [s for _, s in sizes if s]
    assert len(with_data) == 1 and sizes[0][1] > 300, sizes

    # Real clients with small limits still read everything, in order.
    k = KafkaConsumer(bootstrap_servers=broker.bootstrap, fetch_max_bytes=3000, max_partition_fetch_bytes=1000,
                      auto_offset_reset="earliest", consumer_timeout_ms=15_000)
    k.assign([KTP(topic_name, i) for i in range(partitions)])
    k.seek_to_beginning()
    got = [m.value[:6] for m in k if True]
    k.close()
    assert sorted(got) == [b"%06d" % i for i in range(n)]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"c-{topic_name}", "fetch.max.bytes": 3000,
                  "max.partition.fetch.bytes": 1000, "message.max.bytes": 3000,
                  "receive.message.max.bytes": 3000 + 512,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, i, 0) for i in range(partitions)])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append(m.value()[:6])
    c.close()
    assert sorted(seen) == [b"%06d" % i for i in range(n)]
    assert sorted(aiokafka_read(broker.bootstrap, topic_name, partitions, n)) == [b"%06d" % i for i in range(n)]


def aiokafka_read(bootstrap: str, topic: str, partitions: int, n: int) -> list[bytes]:
    """Everything from offset 0 with aiokafka at small fetch limits."""
    import asyncio

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP

    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_bytes=3000,
                                    max_partition_fetch_bytes=1000, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [ATP(topic, i) for i in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            got: list[bytes] = []
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got += [r.value[:6] for r in records]
            return got
        finally:
            await consumer.stop()
    return asyncio.run(run())


def test_a_huge_appended_batch_is_fetched_in_bounded_slices(broker, topic_name):
    """One 6 MB Arrow batch appended through Flight (bypassing the client's own chunking) is
    served in slices no larger than the fetch limits, and every record arrives once."""
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics([NewTopic(topic_name, 1, 1)])
    n = 6000
    values = pa.array([b"%06d" % i + b"v" * 1000 for i in range(n)], pa.binary())
    batch = pa.record_batch([values], names=["value"])
    f = flight.connect(broker.flight_url)
    writer, acks = f.do_put(flight.FlightDescriptor.for_command(AppendRequest(topic_name, 0).to_bytes()), batch.schema)
    writer.write_batch(batch)
    writer.done_writing()
    while acks.read() is not None:
        pass
    writer.close()
    f.close()
    sizes = raw_fetch(broker.bootstrap, topic_name, [0], max_bytes=1 << 20, partition_max_bytes=1 << 20)
    assert 0 < sizes[0][1] <= 1 << 20
    sizes = raw_fetch(broker.bootstrap, topic_name, [0], max_bytes=1 << 20, partition_max_bytes=1 << 20, offset=4321)
    assert 0 < sizes[0][1] <= 1 << 20
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"c-{topic_name}", "fetch.max.bytes": 1 << 20,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    seen = []
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            seen.append((m.offset(), m.value()[:6]))
    c.close()
    assert seen == [(i, b"%06d" % i) for i in range(n)]


def test_json_table_created_through_kafka_configs(broker, topic_name):
    """fluvial.value.format=json takes a JSON Schema; an Avro schema there is refused saying so."""
    import json

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
              "properties": {"id": {"type": "integer"}, "item": {"type": "string"}, "qty": {"type": ["integer", "null"]}},
              "required": ["id", "item"]}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    avro = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    bad = admin.create_topics([CNewTopic(topic_name, 1, 1, config={
        "fluvial.value.format": "json", "fluvial.value.schema": json.dumps(avro)})])[topic_name]
    with pytest.raises(Exception) as info:
        bad.result(10)
    assert "INVALID_CONFIG" in str(info.value) or "InvalidConfig" in repr(info.value)
    assert "JSON Schema" in str(info.value) and "fluvial.value.format=avro" in str(info.value)

    admin.create_topics([CNewTopic(topic_name, 1, 1, config={
        "fluvial.value.format": "json", "fluvial.value.schema": json.dumps(schema)})])[topic_name].result(10)
    sr = SchemaRegistryClient({"url": broker.http_url})
    latest = sr.get_latest_version(f"{topic_name}-value")
    assert latest.schema.schema_type == "JSON"
    ser = JSONSerializer(json.dumps(schema), sr, conf={"auto.register.schemas": False, "use.latest.version": True})
    de = JSONDeserializer(json.dumps(schema))
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    docs = [{"id": i, "item": f"i{i}", "qty": None if i % 3 else i} for i in range(50)]
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for d in docs:
        p.produce(topic_name, value=ser(d, ctx), partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"j-{topic_name}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic_name, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < len(docs) and time.monotonic() < deadline:
        got.extend(de(m.value(), ctx) for m in c.consume(100, timeout=1) if m.error() is None)
    c.close()
    assert [{k: v for k, v in g.items() if v is not None} for g in got] == \
        [{k: v for k, v in d.items() if v is not None} for d in docs]
    import fluvial.client as fc
    with fc.connect(broker.flight_url) as client:
        assert client.table(topic_name).schema.names[-3:] == ["id", "item", "qty"]


# -- admin -------------------------------------------------------------------------------


def test_manual_replica_assignments_naming_this_broker(broker, topic_name):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewPartitions
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([CNewTopic(topic_name, 2, replica_assignment=[[1], [1]])])[topic_name].result(15)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 2
    admin.create_partitions([NewPartitions(topic_name, 3, replica_assignment=[[1]])])[topic_name].result(15)
    assert len(admin.list_topics(topic_name, timeout=10).topics[topic_name].partitions) == 3
    # Another broker, or a replica twice: refused as Kafka refuses them.
    for bad in ([[2]], [[1, 1]]):
        with pytest.raises(KafkaException) as info:
            admin.create_partitions([NewPartitions(topic_name, 4, replica_assignment=bad)])[topic_name].result(15)
        assert info.value.args[0].name() == "INVALID_REPLICA_ASSIGNMENT"
    with pytest.raises(KafkaException) as info:
        admin.create_topics([CNewTopic(topic_name + "-x", 2, replica_assignment=[[1], [7]])])[topic_name + "-x"].result(15)
    assert info.value.args[0].name() == "INVALID_REPLICA_ASSIGNMENT"
    # kafka-python spells it as a map of partition -> replicas.
    KafkaAdminClient(bootstrap_servers=broker.bootstrap).create_topics(
        [NewTopic(topic_name + "-k", num_partitions=-1, replication_factor=-1, replica_assignments={0: [1], 1: [1]})])
    assert len(admin.list_topics(topic_name + "-k", timeout=10).topics[topic_name + "-k"].partitions) == 2


def test_standard_topic_configs_are_known_and_unsupported_values_refused(broker, topic_name):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([CNewTopic(topic_name, 1, config={
        "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.2", "preallocate": "false",
        "flush.messages": "1", "flush.ms": "100", "segment.index.bytes": "4096",
        "unclean.leader.election.enable": "true"})])[topic_name].result(15)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic_name)])
    configs = list(described.values())[0].result(15)
    for name in ("delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms", "segment.jitter.ms",
                 "file.delete.delay.ms", "message.timestamp.after.max.ms", "compression.zstd.level"):
        assert name in configs, name
    assert configs["delete.retention.ms"].value == "1000"
    for name, value in (("preallocate", "true"), ("segment.jitter.ms", "100"), ("min.cleanable.dirty.ratio", "2")):
        with pytest.raises(KafkaException) as info:
            admin.create_topics([CNewTopic(topic_name + "-bad", 1, config={name: value})])[topic_name + "-bad"].result(15)
        assert info.value.args[0].name() == "INVALID_CONFIG", name


def test_segment_index_bytes_rolls_segments(broker, topic_name):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    # Two 16-byte index entries a segment; an entry every batch (index.interval.bytes=1).
    admin.create_topics([CNewTopic(topic_name, 1, config={"segment.index.bytes": "32",
                                                          "index.interval.bytes": "1"})])[topic_name].result(15)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(6):
        p.produce(topic_name, value=b"v%d" % i, partition=0)
        p.flush(10)
    segments = sorted((broker.data_dir / "log" / f"{topic_name}-0").glob("*.arrows"))
    assert [int(s.stem) for s in segments] == [0, 2, 4]


def test_flush_configs_refused_when_the_flush_policy_does_not_meet_them(fresh_broker, topic_name):
    b = fresh_broker("--flush-policy", "interval", "--flush-interval-ms", "1000")
    admin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    from kafka.errors import InvalidConfigurationError
    with pytest.raises(InvalidConfigurationError):
        admin.create_topics([NewTopic(topic_name, 1, 1, topic_configs={"flush.messages": "1"})])
    with pytest.raises(InvalidConfigurationError):
        admin.create_topics([NewTopic(topic_name, 1, 1, topic_configs={"flush.ms": "100"})])
    admin.create_topics([NewTopic(topic_name, 1, 1, topic_configs={"flush.ms": "5000"})])


def test_broker_configs_readable_and_dynamic_ones_changeable(fresh_broker):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

    b = fresh_broker()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    broker_res = ConfigResource(ConfigResource.Type.BROKER, "1")
    configs = list(admin.describe_configs([broker_res]).values())[0].result(15)
    assert configs["broker.id"].value == "1" and configs["broker.id"].is_read_only
    assert configs["log.cleaner.backoff.ms"].value == "15000" and not configs["log.cleaner.backoff.ms"].is_read_only

    change = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry("log.cleaner.backoff.ms", "2500", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("log.cleaner.delete.retention.ms", "1234", incremental_operation=AlterConfigOpType.SET)])
    list(admin.incremental_alter_configs([change]).values())[0].result(15)
    read_only = ConfigResource(ConfigResource.Type.BROKER, "1", incremental_configs=[
        ConfigEntry("num.partitions", "5", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as info:
        list(admin.incremental_alter_configs([read_only]).values())[0].result(15)
    assert info.value.args[0].name() == "INVALID_REQUEST"

    def check(a):
        configs = list(a.describe_configs([broker_res]).values())[0].result(15)
        assert configs["log.cleaner.backoff.ms"].value == "2500"
        assert configs["log.cleaner.backoff.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert configs["num.partitions"].value == "1"
    check(admin)
    # A dynamic log.cleaner.* config is the default of the topic config it names.
    topic = f"dyn-{time.monotonic_ns()}"
    from confluent_kafka.admin import NewTopic as CNewTopic
    admin.create_topics([CNewTopic(topic, 1)])[topic].result(15)
    tconf = list(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values())[0].result(15)
    assert tconf["delete.retention.ms"].value == "1234"
    # Kept across a restart.
    b.stop()
    b.start()
    check(AdminClient({"bootstrap.servers": b.bootstrap}))


def test_group_config_resources(broker, java_tools):
    import subprocess

    group = f"g-{time.monotonic_ns()}"
    alter = java_tools.java_tool("kafka.admin.ConfigCommand", "--bootstrap-server", broker.bootstrap,
                                 "--entity-type", "groups", "--entity-name", group, "--alter",
                                 "--add-config", "consumer.session.timeout.ms=50000")
    res = subprocess.run(alter, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    describe = java_tools.java_tool("kafka.admin.ConfigCommand", "--bootstrap-server", broker.bootstrap,
                                    "--entity-type", "groups", "--entity-name", group, "--describe", "--all")
    res = subprocess.run(describe, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-2000:]
    out = res.stdout.decode()
    assert "consumer.session.timeout.ms=50000" in out and "consumer.heartbeat.interval.ms=5000" in out
    # Out of Kafka's bounds: refused, the stored value stays.
    IA = request_class(ApiKey.INCREMENTAL_ALTER_CONFIGS)
    Res = IA.AlterConfigsResource
    c = RawClient(broker.bootstrap)
    r = c.call(ApiKey.INCREMENTAL_ALTER_CONFIGS, 1, dict(validate_only=False, resources=[Res(
        resource_type=32, resource_name=group, configs=[Res.AlterableConfig(
            name="consumer.session.timeout.ms", config_operation=0, value="5")])]))
    c.close()
    assert r.responses[0].error_code == 40 and "consumer.session.timeout.ms" in r.responses[0].error_message
    res = subprocess.run(describe, capture_output=True, timeout=120)
    assert "consumer.session.timeout.ms=50000" in res.stdout.decode()


def test_authorized_operations_when_asked(broker, topic_name):
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation, AdminClient
    from confluent_kafka.admin import NewTopic as CNewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([CNewTopic(topic_name, 1)])[topic_name].result(15)
    cluster = admin.describe_cluster(include_authorized_operations=True).result(15)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE}
    assert not admin.describe_cluster().result(15).authorized_operations
    topics = admin.describe_topics(TopicCollection([topic_name]), include_authorized_operations=True)
    desc = topics[topic_name].result(15)
    assert set(desc.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
        AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    # DescribeTopicPartitions (what Java admin clients 3.8+ describe topics with) always carries them.
    DTP = request_class(ApiKey.DESCRIBE_TOPIC_PARTITIONS)
    c = RawClient(broker.bootstrap)
    r = c.call(ApiKey.DESCRIBE_TOPIC_PARTITIONS, 0, dict(topics=[DTP.TopicRequest(name=topic_name)],
                                                         response_partition_limit=10, cursor=None))
    c.close()
    assert r.topics[0].topic_authorized_operations == 3576
