"""Internal tiering end to end: closed segments go to the object store (a local folder, or a
real moto_server S3 process), local copies are deleted, and Kafka clients still read every
offset from 0, byte-identical; timestamps, DeleteRecords, faults and crashes."""
from __future__ import annotations

import json
import time

import pyarrow.flight as flight
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

TIERED_CONFIGS = {"segment.bytes": "16384", "local.retention.ms": "0", "remote.storage.enable": "true"}
FAST = ["--remote-log-manager-interval-ms", "150", "--retention-check-interval-ms", "150"]


@pytest.fixture(params=["local", "s3"])
def store_args(request):
    """Broker arguments naming the object store: the default local folder, or moto_server S3."""
    if request.param == "local":
        return []
    server = request.getfixturevalue("moto_s3")
    return server.broker_args(server.create_bucket())


class StoreUnderTest:
    """The object store a test's broker uses, and the same store opened by the test itself."""

    def __init__(self, server=None):
        self.server = server
        self.bucket = server.create_bucket() if server is not None else None

    def broker_args(self) -> list[str]:
        return self.server.broker_args(self.bucket) if self.server is not None else []

    def open(self, data_dir):
        from fluvial.tiering.object_store import open_object_store

        if self.server is None:
            return open_object_store(str(data_dir / "remote"))
        return open_object_store(f"s3://{self.bucket}/remote", self.server.options())


@pytest.fixture(params=["local", "s3"])
def store_under_test(request) -> StoreUnderTest:
    if request.param == "local":
        return StoreUnderTest()
    return StoreUnderTest(request.getfixturevalue("moto_s3"))


def action(broker, kind: str, body: dict):
    client = flight.FlightClient(broker.flight_url)
    try:
        [result] = list(client.do_action(flight.Action(kind, json.dumps(body).encode())))
        return json.loads(result.body.to_pybytes())
    finally:
        client.close()


def create(broker, topic: str, partitions: int = 1, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={**TIERED_CONFIGS, **configs})])[topic].result(10)


# Recent timestamps: retention.ms (7 days by default) covers the remote log too.
BASE_TS = (int(time.time()) - 3600) * 1000


def produce(broker, topic: str, n: int, *, partition: int = 0, start: int = 0, base_ts: int = BASE_TS,
            **extra) -> list[tuple]:
    # Small batches: segments (16 KB) roll many times, whatever the timing.
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", "batch.size": 4096, **extra})
    sent = []
    for i in range(start, start + n):
        key, value = f"k{i}".encode(), (f"value-{i}-" + "x" * (i % 50)).encode()
        headers = [("h", f"{i}".encode())] if i % 3 == 0 else None
        p.produce(topic, key=key, value=value, headers=headers, partition=partition, timestamp=base_ts + i * 10)
        sent.append((key, value, headers, base_ts + i * 10))
    assert p.flush(30) == 0
    return sent


def wait_tiered(broker, topic: str, *, bucket: int = 0, local_start_above: int = 0, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = action(broker, "status", {"name": topic})["buckets"][bucket]
        if status["remote"]["segments"] and status["local"]["start_offset"] > local_start_above:
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"nothing was tiered: {status}")
        time.sleep(0.1)


def consume_confluent(broker, topic: str, partition: int, start, count: int) -> list:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "g", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16384})
    c.assign([TopicPartition(topic, partition, start)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]))
    c.close()
    return got


def consume_kafka_python(broker, topic: str, partition: int, count: int) -> list:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=16384)
    tp = KTP(topic, partition)
    c.assign([tp])
    c.seek_to_beginning(tp)
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        for records in c.poll(500).values():
            got.extend((r.offset, r.key, r.value, r.headers or None, r.timestamp) for r in records)
    c.close()
    return got


def expected(sent: list, first: int = 0) -> list:
    return [(i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(sent) if i >= first]


def test_kafka_clients_read_tiered_offsets_byte_identical(fresh_broker, store_args, topic_name):
    broker = fresh_broker(*store_args, *FAST)
    create(broker, topic_name)
    sent = produce(broker, topic_name, 3000, **{"compression.type": "lz4"})
    status = wait_tiered(broker, topic_name, local_start_above=1000)
    assert status["log_start_offset"] == 0 and status["high_watermark"] == 3000
    assert status["remote"]["start_offset"] == 0 and status["remote"]["end_offset"] >= status["local"]["start_offset"]
    want = expected(sent)
    assert consume_confluent(broker, topic_name, 0, 0, 3000) == want
    assert [(o, k, v, list(h) if h else None, ts) for o, k, v, h, ts in consume_kafka_python(broker, topic_name, 0, 3000)] \
        == [(o, k, v, h, ts) for o, k, v, h, ts in want]

    # Earliest is the remote log start; a timestamp seek lands in remote data.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ts"})
    low, high = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)
    assert (low, high) == (0, 3000)
    [found] = c.offsets_for_times([TopicPartition(topic_name, 0, BASE_TS + 123 * 10 - 5)], timeout=10)
    assert found.offset == 123
    c.close()
    assert consume_confluent(broker, topic_name, 0, 123, 5) == want[123:128]

    # The remote-segments action tells a native reader where the data is.
    body = action(broker, "remote-segments", {"name": topic_name, "bucket": 0, "start": 0})
    assert body["segments"][0]["base_offset"] == 0 and body["local_start_offset"] == status["local"]["start_offset"] \
        or body["local_start_offset"] >= status["local"]["start_offset"]
    assert "secret_access_key" not in json.dumps(body)


def raw_fetch(broker, topic: str, offset: int):
    from fluvial.protocol.messages import ApiKey, request_class
    from tests.integration.test_bad_input import RawClient

    c = RawClient(broker.bootstrap)
    F = request_class(ApiKey.FETCH)
    body = dict(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
                session_epoch=-1, topics=[F.FetchTopic(topic=topic, partitions=[F.FetchTopic.FetchPartition(
                    partition=0, current_leader_epoch=-1, fetch_offset=offset, log_start_offset=-1,
                    partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")
    try:
        return c.request(ApiKey.FETCH, 11, body).responses[0].partitions[0]
    finally:
        c.close()


def fetch_answered(broker, topic: str, offset: int, timeout: float = 20):
    """A fetch of ``offset`` repeated while the broker answers "nothing yet" (a remote read
    slower than remote.fetch.max.wait.ms), as a Kafka client does."""
    deadline = time.monotonic() + timeout
    while True:
        part = raw_fetch(broker, topic, offset)
        if part.error_code or part.records or time.monotonic() > deadline:
            return part
        time.sleep(0.1)


def remote_keys(broker, store, topic: str) -> list[str]:
    return [k for k in store.list("log/") if k.split("/")[1].startswith(topic + "-")]


def wait_store_holds_the_manifest(broker, store, topic: str, timeout: float) -> set[str]:
    """Until the store holds exactly the objects bucket 0's committed manifest lists (no
    orphans, nothing missing); returns those keys."""
    deadline = time.monotonic() + timeout
    while True:
        listed = {s["key"] for s in action(broker, "remote-segments", {"name": topic, "bucket": 0,
                                                                        "start": 0})["segments"]}
        keys = set(remote_keys(broker, store, topic))
        if keys == listed:
            return keys
        assert time.monotonic() < deadline, (keys - listed, listed - keys)
        time.sleep(0.2)


def test_corrupt_or_missing_remote_object_is_a_storage_error(fresh_broker, store_under_test, topic_name):
    from fluvial.protocol.errors import ErrorCode

    broker = fresh_broker(*store_under_test.broker_args(), *FAST)
    create(broker, topic_name)
    sent = produce(broker, topic_name, 2000)
    status = wait_tiered(broker, topic_name, local_start_above=0)
    store = store_under_test.open(broker.data_dir)
    first = sorted(remote_keys(broker, store, topic_name))[0]
    data = bytearray(store.get(first))
    data[len(data) // 3] ^= 0x5A
    store.put(first, bytes(data))
    part = fetch_answered(broker, topic_name, 0)
    assert part.error_code == ErrorCode.KAFKA_STORAGE_ERROR and not part.records
    store.delete([first])
    part = fetch_answered(broker, topic_name, 0)
    assert part.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "cannot serve" in broker.log_tail(200)
    # Local offsets are still served, and the broker keeps serving.
    local = status["local"]["start_offset"]
    assert consume_confluent(broker, topic_name, 0, local, 5) == expected(sent)[local:local + 5]


def test_store_down_keeps_produce_working_and_uploads_catch_up(fresh_broker, own_moto_s3, topic_name):
    bucket = own_moto_s3.create_bucket()
    broker = fresh_broker(*own_moto_s3.broker_args(bucket), *FAST)
    create(broker, topic_name)
    own_moto_s3.kill()
    sent = produce(broker, topic_name, 2500)  # acknowledged while the store is down
    deadline = time.monotonic() + 20
    while (status := action(broker, "status", {"name": topic_name})["buckets"][0])["upload_failures"] == 0:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert status["remote"]["segments"] == 0 and "cannot" in status["last_error"]
    assert status["local"]["start_offset"] == 0  # nothing local deleted before it is remote
    own_moto_s3.start()
    own_moto_s3.create_bucket(bucket)  # the restarted server is empty
    wait_tiered(broker, topic_name, local_start_above=0, timeout=40)
    deadline = time.monotonic() + 20
    while action(broker, "status", {"name": topic_name})["buckets"][0]["upload_failures"]:
        assert time.monotonic() < deadline  # a round that succeeds clears the failure count
        time.sleep(0.1)
    assert consume_confluent(broker, topic_name, 0, 0, 2500) == expected(sent)


def produce_steadily(broker, topic: str, start: int, rate: int, seconds: float, until=None,
                     max_seconds: float = 30) -> tuple[list[tuple], list[float]]:
    """Produce ``rate`` records/s with acks=all for ``seconds`` and then until ``until()`` holds
    (asked every half second); every record's ack latency."""
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", "batch.size": 4096})
    sent, latencies, errors = [], [], []

    def acked(err, msg, started):
        if err is not None:
            errors.append(err)
        latencies.append(time.monotonic() - started)

    began = next_check = time.monotonic()
    i = start
    while True:
        now = time.monotonic()
        elapsed = now - began
        if elapsed >= seconds and now >= next_check:
            if until is None or until():
                break
            next_check = now + 0.5
        assert elapsed < max_seconds, "the condition to stop producing never held"
        while i - start < elapsed * rate:
            key, value = f"k{i}".encode(), (f"value-{i}-" + "x" * (i % 50)).encode()
            p.produce(topic, key=key, value=value, partition=0, timestamp=BASE_TS + i * 10,
                      on_delivery=lambda err, msg, t=time.monotonic(): acked(err, msg, t))
            sent.append((key, value, None, BASE_TS + i * 10))
            i += 1
        p.poll(0.01)
    assert p.flush(30) == 0
    assert errors == [] and len(latencies) == len(sent)
    return sent, latencies


def test_store_frozen_mid_upload_keeps_produce_acked_and_uploads_resume(fresh_broker, own_moto_s3, topic_name):
    import os
    import threading

    bucket = own_moto_s3.create_bucket()
    # The store's read timeout is short (1 s: a request to the frozen store fails after 2-3 s)
    # so that several rounds fail within the test; a stall of the event loop on the store
    # would show in ack latencies and in the time a fetch of remote offsets takes.
    options = ["--object-store-option", "read_timeout=1", "--object-store-option", "connect_timeout=1",
               "--object-store-option", "max_attempts=1"]
    broker = fresh_broker(*own_moto_s3.broker_args(bucket), *options, *FAST)
    create(broker, topic_name)
    first = produce(broker, topic_name, 1000)
    before = wait_tiered(broker, topic_name, local_start_above=0)  # uploads committed, local copies gone
    store_view = StoreUnderTest(own_moto_s3)
    store_view.bucket = bucket
    store = store_view.open(broker.data_dir)

    assert raw_fetch(broker, topic_name, 999).records  # a local offset (and the raw client loaded)
    own_moto_s3.freeze()
    try:
        # A Kafka consumer reading remote offsets from 0 while the store is frozen.
        consumed: list = []
        consumer_errors: list = []

        stop = threading.Event()

        def consume() -> None:
            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "frozen", "enable.auto.commit": False,
                          "max.partition.fetch.bytes": 16384})
            c.assign([TopicPartition(topic_name, 0, 0)])
            deadline = time.monotonic() + 50
            while len(consumed) < total_wanted[0] and time.monotonic() < deadline and not stop.is_set():
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    consumer_errors.append(m.error())
                    continue
                consumed.append((m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1], time.monotonic()))
            c.close()

        total_wanted = [10**9]
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()

        # A fetch of a remote offset is answered within remote.fetch.max.wait.ms: no records
        # and no error (the client fetches again), or KAFKA_STORAGE_ERROR once the store's own
        # timeout fires (retried by clients) -- never wrong data, never a hung request.
        from fluvial.protocol.errors import ErrorCode
        began = time.monotonic()
        part = raw_fetch(broker, topic_name, 0)
        fetch_s = time.monotonic() - began
        assert fetch_s < 1.5
        assert (part.error_code, list(part.records or [])) == (0, []) or \
            part.error_code == ErrorCode.KAFKA_STORAGE_ERROR

        failures = lambda: action(broker, "status", {"name": topic_name})["buckets"][0]["upload_failures"]  # noqa: E731
        second, latencies = produce_steadily(broker, topic_name, 1000, 250, seconds=6, until=lambda: failures() >= 2)
        status = action(broker, "status", {"name": topic_name})["buckets"][0]
        # Produce was acknowledged throughout, without the store's timeouts showing in it.
        assert max(latencies) < 2.0, sorted(latencies)[-5:]
        print(f"store frozen: {len(latencies)} acks, max latency {max(latencies):.3f} s, remote fetch answered "
              f"in {fetch_s:.3f} s; load {os.getloadavg()}")
        assert status["upload_failures"] >= 2 and status["last_error"], status
        # Data stays local: no local segment went without a committed upload.
        assert status["high_watermark"] == 1000 + len(second)
        assert status["local"]["start_offset"] <= (status["remote"]["end_offset"] or 0)
        assert status["local"]["segments"] > before["local"]["segments"] + 3
        log_text = broker.log_tail(400)
        assert f"tiering of {topic_name}-0 failed (attempt 2" in log_text
        # What the consumer got so far is right (a cached row group may serve some).
        assert [row[:5] for row in consumed] == expected(first)[:len(consumed)]
    except BaseException:
        stop.set()
        raise
    finally:
        own_moto_s3.thaw()

    sent = first + second
    total_wanted[0] = len(sent)
    # Uploads catch up: every closed segment tiered, local copies gone, failures cleared.
    deadline = time.monotonic() + 40
    while True:
        status = action(broker, "status", {"name": topic_name})["buckets"][0]
        if status["local"]["segments"] == 1 and status["upload_failures"] == 0 and \
                status["local"]["start_offset"] == status["remote"]["end_offset"]:
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert status["remote"]["end_offset"] > 1000 and status["log_start_offset"] == 0
    reader.join(50)
    assert consumer_errors == []
    # The consumer that started while the store was frozen got every record once, in order.
    assert [row[:5] for row in consumed] == expected(sent)
    # And a new one, from offset 0 with every local copy below the active segment gone.
    assert consume_confluent(broker, topic_name, 0, 0, len(sent)) == expected(sent)
    # No orphans: exactly the objects the committed manifest lists (uploads given up on
    # while the store was frozen, which it may have stored on waking, were collected).
    wait_store_holds_the_manifest(broker, store, topic_name, timeout=20)


@pytest.mark.parametrize("step", ["remote.after_upload", "remote.after_commit"])
def test_kill_9_at_a_tiering_step_serves_every_offset_once(tmp_path, store_under_test, step, topic_name):
    from tests.support.broker_process import BrokerProcess

    # Produce with tiering off, then restart with it on and the fault armed: the first
    # tiering round reaches the step and the broker is killed there.
    data_dir = tmp_path / "crash"
    args = store_under_test.broker_args()
    broker = BrokerProcess(data_dir, *args, "--remote-log-manager-interval-ms", "3600000", *FAST[2:]).start()
    try:
        create(broker, topic_name)
        sent = produce(broker, topic_name, 1200)
        broker.stop()
        import os
        os.environ["FLUVIAL_FAULT"] = step
        try:
            broker = BrokerProcess(data_dir, *args, *FAST, port=broker.port)
            broker.start()
        finally:
            del os.environ["FLUVIAL_FAULT"]
        deadline = time.monotonic() + 30
        while broker.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker.proc.poll() is not None, "the fault was not reached"
        broker.proc = None
        store = store_under_test.open(data_dir)
        assert remote_keys(broker, store, topic_name)  # an object is there (an orphan, or listed)
        broker = BrokerProcess(data_dir, *args, *FAST, port=broker.port).start()
        status = wait_tiered(broker, topic_name, local_start_above=0)
        assert status["log_start_offset"] == 0
        assert consume_confluent(broker, topic_name, 0, 0, 1200) == expected(sent)
        # Once every closed segment is tiered, the objects are exactly those the manifest
        # lists: the orphan of the killed round was collected, nothing is served twice.
        deadline = time.monotonic() + 30
        while action(broker, "status", {"name": topic_name})["buckets"][0]["local"]["segments"] > 1:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        listed = {s["key"] for s in action(broker, "remote-segments", {"name": topic_name, "bucket": 0,
                                                                        "start": 0})["segments"]}
        assert set(remote_keys(broker, store, topic_name)) == listed
    finally:
        if broker.alive():
            broker.stop()


def test_kill_9_after_expiry_commit_serves_from_new_start_and_collects_expired(tmp_path, store_under_test,
                                                                               topic_name):
    import os

    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    from tests.support.broker_process import BrokerProcess

    data_dir = tmp_path / "expiry"
    args = [*store_under_test.broker_args(), *FAST]
    broker = BrokerProcess(data_dir, *args).start()
    try:
        create(broker, topic_name)
        old = produce(broker, topic_name, 800, base_ts=BASE_TS - 3 * 24 * 3600 * 1000)  # three days old
        new = produce(broker, topic_name, 800, start=800)
        wait_tiered(broker, topic_name, local_start_above=800)  # the old records' segments are remote
        broker.stop()
        # Restart with the fault armed, then shorten retention.ms: the next round commits the
        # manifest without the old segments and the broker is killed before it deletes them.
        os.environ["FLUVIAL_FAULT"] = "remote.after_expire_commit"
        try:
            broker = BrokerProcess(data_dir, *args, port=broker.port).start()
        finally:
            del os.environ["FLUVIAL_FAULT"]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        res = ConfigResource("topic", topic_name, incremental_configs=[
            ConfigEntry("retention.ms", str(24 * 3600 * 1000), incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(10)
        deadline = time.monotonic() + 30
        while broker.proc.poll() is None:
            assert time.monotonic() < deadline, "the fault was not reached"
            time.sleep(0.05)
        broker.proc = None
        store = store_under_test.open(data_dir)
        left = remote_keys(broker, store, topic_name)
        next_offset = lambda key: int(key.rsplit("/", 1)[1].split("-")[1])  # noqa: E731
        expired = [k for k in left if next_offset(k) <= 800]
        assert expired  # the expired objects outlived the commit: orphans now

        broker = BrokerProcess(data_dir, *args, port=broker.port).start()
        status = action(broker, "status", {"name": topic_name})["buckets"][0]
        start = status["log_start_offset"]
        # The committed expiry holds: the log starts past every old-only segment, and no
        # new record was dropped.
        assert 0 < start <= 800 and status["remote"]["start_offset"] == start
        assert start == max(next_offset(k) for k in expired)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "expired"})
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (start, 1600)
        c.close()
        got = consume_confluent(broker, topic_name, 0, OFFSET_BEGINNING, 1600 - start)
        assert got == expected(old + new, start)  # every offset from the new start, exactly once
        # The expired objects are collected; the store holds exactly what the manifest lists.
        keys = wait_store_holds_the_manifest(broker, store, topic_name, timeout=30)
        assert not set(expired) & keys and min(next_offset(k) for k in keys) > start
    finally:
        if broker.alive():
            broker.stop()


def test_delete_records_and_retention_cover_remote_data(fresh_broker, topic_name):
    from fluvial.tiering.object_store import open_object_store

    broker = fresh_broker(*FAST)
    create(broker, topic_name)
    sent = produce(broker, topic_name, 2500)
    status = wait_tiered(broker, topic_name, local_start_above=1000)
    assert status["remote"]["segments"] >= 2
    store = open_object_store(str(broker.data_dir / "remote"))
    before = set(remote_keys(broker, store, topic_name))

    # DeleteRecords inside the remote log: the log start moves there, objects wholly below go.
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    target = 700
    low = list(admin.delete_records([TopicPartition(topic_name, 0, target)]).values())[0].result(10)
    assert low.low_watermark == target
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "dr"})
    assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (target, 2500)
    c.close()
    status = action(broker, "status", {"name": topic_name})["buckets"][0]
    assert status["remote"]["start_offset"] == target
    after = set(remote_keys(broker, store, topic_name))
    next_offset = lambda key: int(key.rsplit("/", 1)[1].split("-")[1])  # noqa: E731
    assert any(next_offset(k) <= target for k in before)
    # Objects wholly below the new start are gone (uploads of newer segments go on meanwhile).
    assert all(next_offset(k) > target for k in after) and before & after
    got = consume_confluent(broker, topic_name, 0, OFFSET_BEGINNING, 2500 - target)
    # Whole batches are served: a consumer skips records below its position, as with Kafka.
    assert got == expected(sent, target)
    part = raw_fetch(broker, topic_name, target - 1)
    from fluvial.protocol.errors import ErrorCode
    assert part.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and part.log_start_offset == target

    # retention.bytes covers the whole log: remote segments expire until it fits.
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    res = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("retention.bytes", "60000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(10)
    deadline = time.monotonic() + 20
    while (s := action(broker, "status", {"name": topic_name})["buckets"][0])["log_start_offset"] <= target:
        assert time.monotonic() < deadline, s
        time.sleep(0.1)
    start = s["log_start_offset"]
    assert consume_confluent(broker, topic_name, 0, OFFSET_BEGINNING, 2500 - start)[0][0] == start


def test_configs_are_described_with_sources_and_validated(fresh_broker, topic_name):
    broker = fresh_broker("--remote-storage-enable", "true")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1, config={"local.retention.ms": "60000"})])[topic_name].result(10)
    entries = list(admin.describe_configs([ConfigResource("topic", topic_name)]).values())[0].result(10)
    enable = entries["remote.storage.enable"]
    assert enable.value == "true" and enable.source == 4  # STATIC_BROKER_CONFIG: the broker-wide default
    assert entries["local.retention.ms"].value == "60000" and entries["local.retention.ms"].source == 1
    assert entries["local.retention.bytes"].value == "-2" and entries["local.retention.bytes"].is_default
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    for name, value in [("local.retention.ms", str(8 * 24 * 3600 * 1000)), ("local.retention.bytes", "-7"),
                        ("remote.storage.enable", "maybe")]:
        bad = ConfigResource("topic", topic_name, incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(Exception) as err:
            admin.incremental_alter_configs([bad])[bad].result(10)
        assert "INVALID_CONFIG" in str(err.value) or "Invalid value" in str(err.value)
    off = ConfigResource("topic", topic_name, incremental_configs=[
        ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([off])[off].result(10)
    entries = list(admin.describe_configs([ConfigResource("topic", topic_name)]).values())[0].result(10)
    assert entries["remote.storage.enable"].value == "false" and entries["remote.storage.enable"].source == 1


def test_describe_tools_show_local_and_remote_storage(fresh_broker, topic_name):
    import subprocess
    import sys

    broker = fresh_broker(*FAST)
    create(broker, topic_name)
    produce(broker, topic_name, 2000)
    status = wait_tiered(broker, topic_name, local_start_above=0)
    run = lambda *a: subprocess.run([sys.executable, "-m", "fluvial.broker", *a], capture_output=True, text=True,
                                    timeout=60)
    out = run("topic", "describe", topic_name, "--bootstrap", broker.bootstrap, "--table-api", broker.flight_url)
    assert out.returncode == 0, out.stderr
    described = json.loads(out.stdout)
    [offsets] = described["offsets"]
    assert offsets["log_start"] == 0 and offsets["high_watermark"] == 2000
    assert offsets["local_log_start"] >= status["local"]["start_offset"] > 0
    assert offsets["last_tiered"] >= offsets["local_log_start"] - 1
    [storage] = described["storage"]
    assert storage["remote"]["segments"] >= 1 and storage["remote"]["bytes"] > 0 and storage["local"]["bytes"] > 0
    out = run("table", "describe", topic_name, "--url", broker.flight_url)
    assert out.returncode == 0, out.stderr
    assert "remote_segments" in out.stdout and "object store: file://" in out.stdout


def test_avro_table_tiered_is_byte_identical(fresh_broker, store_args, topic_name):
    import random

    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from tests.unit.test_schema_codecs import SCHEMA20, make_record

    broker = fresh_broker(*store_args, *FAST)
    create(broker, topic_name, **{"fluvial.value.format": "avro", "fluvial.value.schema": json.dumps(SCHEMA20),
                                  "segment.bytes": "65536"})
    sr = SchemaRegistryClient({"url": broker.http_url})
    ser = AvroSerializer(sr, json.dumps(SCHEMA20), conf={"auto.register.schemas": False, "use.latest.version": True})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    rng = random.Random(5)
    payloads = [ser(make_record(rng, i), ctx) for i in range(1500)]
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "batch.size": 8192, "acks": "all",
                  "compression.type": "zstd"})
    for i, v in enumerate(payloads):
        p.produce(topic_name, key=b"%d" % i, value=v, partition=0, timestamp=BASE_TS + i)
    assert p.flush(30) == 0
    status = wait_tiered(broker, topic_name, local_start_above=300)
    assert status["remote"]["segments"] >= 1
    got = consume_confluent(broker, topic_name, 0, 0, len(payloads))
    assert [v for _, _, v, _, _ in got] == payloads  # same writer schema id, same Avro bytes


@pytest.mark.java
def test_java_console_consumer_reads_tiered_offsets(fresh_broker, java_tools, topic_name):
    import subprocess

    broker = fresh_broker(*FAST)
    create(broker, topic_name)
    sent = produce(broker, topic_name, 1500)
    wait_tiered(broker, topic_name, local_start_above=300)
    cmd = java_tools.java_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                               broker.bootstrap, "--topic", topic_name, "--partition", "0", "--offset", "earliest",
                               "--max-messages", str(len(sent)), "--timeout-ms", "30000",
                               "--property", "print.key=true", "--property", "key.separator=|",
                               "--property", "print.offset=true")
    res = subprocess.run(cmd, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    lines = [line for line in res.stdout.decode().splitlines() if "|" in line]
    # The separator also goes between offset and key: "Offset:N|key|value", every offset once, in order.
    assert lines == [f"Offset:{i}|{k.decode()}|{v.decode()}" for i, (k, v, _, _) in enumerate(sent)]


def test_dropping_a_table_deletes_its_remote_objects(fresh_broker, topic_name):
    from fluvial.tiering.object_store import open_object_store

    broker = fresh_broker(*FAST)
    create(broker, topic_name)
    produce(broker, topic_name, 1500)
    wait_tiered(broker, topic_name, local_start_above=0)
    store = open_object_store(str(broker.data_dir / "remote"))
    assert remote_keys(broker, store, topic_name)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic_name])[topic_name].result(10)
    deadline = time.monotonic() + 20
    while remote_keys(broker, store, topic_name):
        assert time.monotonic() < deadline, "the dropped table's objects stayed"
        time.sleep(0.1)
    # A new table of the same name starts with an empty remote log.
    create(broker, topic_name)
    status = action(broker, "status", {"name": topic_name})["buckets"][0]
    assert status["remote"]["segments"] == 0 and status["log_start_offset"] == 0


def test_tiering_actions_refuse_bad_requests(fresh_broker, topic_name):
    broker = fresh_broker()
    create(broker, topic_name)
    for body, expected_error in [({}, "names no table"), ({"name": "nope", "bucket": 0}, "nope"),
                                 ({"name": topic_name, "bucket": 5}, "no bucket 5"),
                                 ({"name": topic_name, "bucket": "0"}, "must be an integer")]:
        with pytest.raises(flight.FlightError) as err:
            action(broker, "remote-segments", body)
        assert expected_error in str(err.value)
    with pytest.raises(flight.FlightError):
        action(broker, "status", {"name": "nope"})
    # A table without remote data: no segments, the local start is the log start.
    body = action(broker, "remote-segments", {"name": topic_name, "bucket": 0, "start": 0})
    assert body["segments"] == [] and body["log_start_offset"] == body["local_start_offset"] == 0
    assert body["store"]["url"].startswith("file://")


def test_list_offsets_specs_over_remote_data(fresh_broker, topic_name):
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient
    from kafka.protocol.consumer.offsets import OffsetSpec

    broker = fresh_broker(*FAST)
    create(broker, topic_name)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "acks": "all", "batch.size": 4096})
    for i in range(1500):
        # Offset 7 carries the largest timestamp; it ends up in the remote log.
        p.produce(topic_name, value=b"x" * 60, partition=0, timestamp=BASE_TS + (10**6 if i == 7 else i))
    assert p.flush(30) == 0
    status = wait_tiered(broker, topic_name, local_start_above=300)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    tp = KTP(topic_name, 0)
    answers = {spec: admin.list_partition_offsets({tp: spec})[tp] for spec in
               (OffsetSpec.EARLIEST, OffsetSpec.EARLIEST_LOCAL, OffsetSpec.LATEST_TIERED, OffsetSpec.MAX_TIMESTAMP,
                OffsetSpec.LATEST)}
    admin.close()
    assert answers[OffsetSpec.EARLIEST].offset == 0
    assert answers[OffsetSpec.EARLIEST_LOCAL].offset >= status["local"]["start_offset"] > 0
    assert answers[OffsetSpec.LATEST_TIERED].offset >= status["remote"]["end_offset"] - 1
    assert (answers[OffsetSpec.MAX_TIMESTAMP].offset, answers[OffsetSpec.MAX_TIMESTAMP].timestamp) == \
        (7, BASE_TS + 10**6)
    assert answers[OffsetSpec.LATEST].offset == 1500


def test_retention_ms_expires_remote_segments(fresh_broker, topic_name):
    broker = fresh_broker(*FAST)
    create(broker, topic_name, **{"retention.ms": str(24 * 3600 * 1000)})
    old = produce(broker, topic_name, 800, base_ts=BASE_TS - 3 * 24 * 3600 * 1000)  # three days old
    new = produce(broker, topic_name, 800, start=800)
    # The old records' segments are uploaded and then expire by retention.ms (the whole
    # log's): the log start moves past them, in the remote log and for Kafka clients.
    deadline = time.monotonic() + 30
    while (status := action(broker, "status", {"name": topic_name})["buckets"][0])["log_start_offset"] < 400:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    time.sleep(1)  # later rounds may expire more old segments, never a new record
    status = action(broker, "status", {"name": topic_name})["buckets"][0]
    start = status["log_start_offset"]
    assert start <= 800 and status["remote"]["start_offset"] == start
    got = consume_confluent(broker, topic_name, 0, OFFSET_BEGINNING, 1600 - start)
    assert got[0][0] == start and got == expected(old + new, start)
