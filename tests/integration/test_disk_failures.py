"""A failing or full disk: the bucket goes offline with KAFKA_STORAGE_ERROR, nothing whose
write or fsync failed is acknowledged, other buckets keep serving, shutdown stays clean.

fsync failures are injected (``fluvial.broker.log.fault_injection``: an fsync of a chosen
bucket's segments fails with EIO); the full disk is a real small tmpfs the test mounts
(skipped when mounting is not allowed).
"""
from __future__ import annotations

import os
import subprocess
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from fluvial.broker.log.fault_injection import ENV_VAR as FAULTS_ENV
from fluvial.client import connect
from fluvial.client.errors import StorageError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, request_class
from tests.integration.test_bad_input import RawClient
from tests.support.broker_process import BrokerProcess

TOPIC = "disk"


def create_topic(broker: BrokerProcess, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(10)


def produce(broker: BrokerProcess, partition: int, values: list[bytes], **config) -> list[tuple]:
    """Send `values` to one partition; (error code or None, offset) per record, in order."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                  "message.send.max.retries": 0, "message.timeout.ms": 10_000, **config})
    out: list[tuple] = []
    for v in values:
        p.produce(TOPIC, value=v, partition=partition,
                  on_delivery=lambda err, msg: out.append((err.code(), None) if err else (None, msg.offset())))
    assert p.flush(20) == 0
    return out


def fetch_error(broker: BrokerProcess, partition: int) -> int:
    """The error code of a Fetch of the partition from offset 0, as the broker answers it."""
    c = RawClient(broker.bootstrap)
    F = request_class(ApiKey.FETCH)
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=TOPIC, partitions=[F.FetchTopic.FetchPartition(
                    partition=partition, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                    partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")
    try:
        return c.request(ApiKey.FETCH, 11, body).responses[0].partitions[0].error_code
    finally:
        c.close()


def consumer_reads(broker: BrokerProcess, partition: int, seconds: float = 3) -> tuple[int, list[int]]:
    """What a confluent-kafka consumer gets from offset 0 within `seconds`: (records, error codes)."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, partition, 0)])
    records, errors = 0, []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not records:
            for m in c.consume(100, timeout=0.2):
                if m.error() is None:
                    records += 1
                else:
                    errors.append(m.error().code())
    finally:
        c.close()
    return records, errors


def read_values(broker: BrokerProcess, partition: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "r", "enable.auto.commit": False})
    end = c.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=10)[1]
    c.assign([TopicPartition(TOPIC, partition, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < end and time.monotonic() < deadline:
        for m in c.consume(100, timeout=0.5):
            if m.error() is None:
                got.append(m.value())
    c.close()
    return got


def offline_replicas(broker: BrokerProcess) -> dict[int, list[int]]:
    """Each partition's offline replicas as Metadata v9 reports them (kafka-python's admin client)."""
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (topic,) = admin.describe_topics([TOPIC])
    finally:
        admin.close()
    return {p["partition_index"]: p["offline_replicas"] for p in topic["partitions"]}


def test_failed_fsync_takes_only_that_bucket_offline_and_is_never_acknowledged(tmp_path, monkeypatch):
    faults = tmp_path / "fsync-faults"
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    broker = BrokerProcess(tmp_path / "data").start()
    create_topic(broker)
    assert produce(broker, 0, [b"a0", b"a1"]) == [(None, 0), (None, 1)]

    faults.write_text(f"{TOPIC}-0/\n")
    # Idempotent: its retry of the failed batch must not get the duplicate answer.
    failed = produce(broker, 0, [b"lost?"], **{"enable.idempotence": True, "message.send.max.retries": 3,
                                                "retry.backoff.ms": 50, "message.timeout.ms": 3000})
    # librdkafka retries KAFKA_STORAGE_ERROR (retriable) and reports it once retries are spent.
    assert failed == [(KafkaError.KAFKA_STORAGE_ERROR, None)]
    faults.unlink()  # the disk "recovers": the bucket stays offline, as after fsyncgate it must
    assert produce(broker, 0, [b"after"]) == [(KafkaError.KAFKA_STORAGE_ERROR, None)]
    assert fetch_error(broker, 0) == ErrorCode.KAFKA_STORAGE_ERROR
    # Metadata keeps the leader (producers get the error at once) and lists the replica offline.
    assert offline_replicas(broker) == {0: [1], 1: []}   # node 1, the only broker
    # librdkafka treats the fetch error as retriable: the consumer gets neither records nor an error.
    assert consumer_reads(broker, 0) == (0, [])
    # The other bucket of the same table serves on.
    assert produce(broker, 1, [b"b0"]) == [(None, 0)]
    assert fetch_error(broker, 1) == ErrorCode.NONE
    assert consumer_reads(broker, 1)[0] == 1
    # The table API answers the same: StorageError for the offline bucket, the other one serves.
    with connect(broker.flight_url) as client:
        table = client.table(TOPIC)
        with pytest.raises(StorageError, match="offline"):
            table.append(pa.table({"value": [b"flight"]}), bucket=0)
        with pytest.raises(StorageError, match="offline"):
            table.scan(buckets=[0]).to_arrow()
        assert table.append(pa.table({"value": [b"flight"]}), bucket=1)[0].base_offset == 1
    log = broker.log_tail(400)
    assert "OFFLINE" in log and "injected fsync failure" in log

    assert broker.stop() == 0
    assert "Traceback" not in broker.log_tail(100)
    broker.start()
    # Recovery decides from the files: the acknowledged records are there; the batch whose
    # fsync failed may or may not be (it was never acknowledged), nothing else is.
    values = read_values(broker, 0)
    assert values[:2] == [b"a0", b"a1"] and set(values[2:]) <= {b"lost?"}
    assert produce(broker, 0, [b"again"])[0][0] is None
    broker.stop()


def test_a_large_batch_appended_off_the_loop_is_acknowledged_only_after_its_fsync(tmp_path, monkeypatch):
    """A batch of at least 256 KB with acks=all is converted and appended on the executor,
    pipelined with the connection's next requests (`produce._Pipeline`): acknowledged and
    readable when its flush succeeded, never when it failed."""
    faults = tmp_path / "fsync-faults"
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    broker = BrokerProcess(tmp_path / "data").start()
    create_topic(broker)
    large = {"linger.ms": 500, "batch.size": 1_000_000, "batch.num.messages": 100_000}
    values = [b"%04d" % i + b"x" * 1000 for i in range(400)]   # one batch of about 400 KB
    assert produce(broker, 0, values, **large) == [(None, i) for i in range(400)]
    assert read_values(broker, 0) == values

    faults.write_text(f"{TOPIC}-0/\n")
    assert produce(broker, 0, values, **large) == [(KafkaError.KAFKA_STORAGE_ERROR, None)] * 400
    assert fetch_error(broker, 0) == ErrorCode.KAFKA_STORAGE_ERROR
    assert produce(broker, 1, values, **large) == [(None, i) for i in range(400)]   # the other bucket serves
    assert broker.stop() == 0
    assert "Traceback" not in broker.log_tail(100)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mount)],
                                capture_output=True, text=True)
    except OSError as exc:
        pytest.skip(f"cannot mount a small tmpfs here: {exc}")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_answers_producers_at_once_and_shuts_down_cleanly(tmp_path, small_disk):
    broker = BrokerProcess(small_disk / "data").start()
    broker.log_path = tmp_path / "broker.log"  # the log must not be on the full disk
    broker.stop()
    broker.start()
    create_topic(broker, partitions=1)
    # A primary-key table on the same disk: its RocksDB must close cleanly on a full disk too.
    with connect(broker.flight_url) as client:
        schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
        client.create_table("pk", schema, primary_key=["id"])
        client.table("pk").upsert(pa.table({"id": list(range(1000)), "v": ["x" * 100] * 1000}, schema=schema))
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 5,
                  "message.send.max.retries": 0, "message.timeout.ms": 30_000})
    results: list[tuple] = []
    value = os.urandom(50_000)
    started = time.monotonic()
    for _ in range(400):  # 20 MB for a 6 MB disk
        p.produce(TOPIC, value=value, partition=0,
                  on_delivery=lambda err, msg: results.append((err.code() if err else None, time.monotonic())))
        p.poll(0)
        if any(code is not None for code, _ in results):
            break
    assert p.flush(30) == 0
    errors = [(code, at) for code, at in results if code is not None]
    assert errors, "the disk never filled"
    assert {code for code, _ in errors} == {KafkaError.KAFKA_STORAGE_ERROR}
    assert errors[0][1] - started < 10, "the error came as a timeout, not as an answer"
    acked = sum(1 for code, _ in results if code is None)
    assert "OFFLINE" in broker.log_tail(400) and "No space left on device" in broker.log_tail(400)

    assert broker.stop() == 0
    assert "Traceback" not in broker.log_tail(200)
    # Room again (as after an operator frees space): recovery keeps every acknowledged record.
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    broker.start()
    assert read_values(broker, 0)[:acked] == [value] * acked
    with connect(broker.flight_url) as client:
        assert client.table("pk").lookup(pa.table({"id": [0, 999]})).num_rows == 2
    broker.stop()
