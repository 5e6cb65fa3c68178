"""Prometheus metrics: scraped while real Kafka clients produce and consume, parsed with
prometheus_client's own text parser, and checked against what the clients did."""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from fluvial.client import connect

FAST_TIERING = ["--remote-log-manager-interval-ms", "150", "--retention-check-interval-ms", "150"]


class Scrape:
    """One scrape of /metrics: samples by name and labels."""

    def __init__(self, url: str):
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            text = r.read().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = [s for f in self.families.values() for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        found = [s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
        return found[0]

    def values(self, name: str, **labels: str) -> list[float]:
        return [s.value for s in self.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def _produce(bootstrap: str, topic: str, per_partition: dict[int, int], value: bytes) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for partition, n in per_partition.items():
        for i in range(n):
            p.produce(topic, value=value, key=f"k{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def _consume(bootstrap: str, topic: str, group: str, count: int) -> Consumer:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 60
    while got < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    assert got == count
    return c


def test_metrics_follow_a_produce_and_consume_run(fresh_broker, topic_name):
    b = fresh_broker()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for f in admin.create_topics([NewTopic(topic_name, 2, 1), NewTopic(f"{topic_name}-small", 1, 1,
                                                                       config={"max.message.bytes": "2000"})]).values():
        f.result(30)
    value = b"v" * 200
    # Scraped all along the run: every scrape parses, counters never go back or past the truth.
    seen: list[tuple[float, float]] = []
    stop = threading.Event()

    def scrape_all_along() -> None:
        while not stop.is_set():
            s = Scrape(b.http_url)
            seen.append((sum(s.values("fluvial_table_records_in_total", table=topic_name)),
                         sum(s.values("fluvial_table_records_out_total", table=topic_name))))
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape_all_along)
    scraper.start()
    try:
        _produce(b.bootstrap, topic_name, {0: 300, 1: 200}, value)
        # Half-way: the group committed 100 of bucket 0 and nothing of bucket 1.
        c = _consume(b.bootstrap, topic_name, "metrics-group", 500)
    finally:
        stop.set()
        scraper.join()
    assert len(seen) >= 3
    assert all(0 <= i <= 500 and 0 <= o <= 500 for i, o in seen)
    assert [i for i, _ in seen] == sorted(i for i, _ in seen)
    assert [o for _, o in seen] == sorted(o for _, o in seen)
    c.commit(offsets=[TopicPartition(topic_name, 0, 100)], asynchronous=False)
    s = Scrape(b.http_url)
    assert s.value("fluvial_consumer_group_committed_offset", group="metrics-group", table=topic_name, bucket="0") == 100
    assert s.value("fluvial_consumer_group_lag_records", group="metrics-group", table=topic_name, bucket="0") == 200
    assert s.value("fluvial_consumer_group_members", group="metrics-group") == 1
    assert s.value("fluvial_kafka_connections") >= 2  # the consumer's, at least

    c.commit(offsets=[TopicPartition(topic_name, 0, 300), TopicPartition(topic_name, 1, 200)], asynchronous=False)
    c.close()

    # A batch over the topic's max.message.bytes: answered MESSAGE_TOO_LARGE, counted.
    p = Producer({"bootstrap.servers": b.bootstrap, "message.max.bytes": 1_000_000, "retries": 0})
    failures = []
    p.produce(f"{topic_name}-small", value=b"x" * 5000, on_delivery=lambda err, msg: failures.append(err))
    p.flush(30)
    assert failures and failures[0] is not None

    s = Scrape(b.http_url)
    for bucket, n in (("0", 300), ("1", 200)):
        assert s.value("fluvial_bucket_log_end_offset", table=topic_name, bucket=bucket) == n
        assert s.value("fluvial_bucket_high_watermark", table=topic_name, bucket=bucket) == n
        assert s.value("fluvial_bucket_log_start_offset", table=topic_name, bucket=bucket) == 0
        assert s.value("fluvial_bucket_online", table=topic_name, bucket=bucket) == 1
        assert s.value("fluvial_bucket_segments", table=topic_name, bucket=bucket, tier="local") == 1
        assert s.value("fluvial_bucket_size_bytes", table=topic_name, bucket=bucket, tier="local") > n * len(value)
        assert s.value("fluvial_consumer_group_lag_records", group="metrics-group", table=topic_name,
                       bucket=bucket) == 0
    assert s.value("fluvial_table_records_in_total", table=topic_name) == 500
    assert s.value("fluvial_table_bytes_in_total", table=topic_name) > 500 * len(value)
    # Each record was fetched once by the one consumer.
    assert s.value("fluvial_table_records_out_total", table=topic_name) == 500
    assert s.value("fluvial_table_bytes_out_total", table=topic_name) > 500 * len(value)
    assert s.value("fluvial_table_records_in_total", table=f"{topic_name}-small") == 0

    produced = s.value("fluvial_kafka_requests_total", api="produce")
    assert produced >= 2  # batched by the producer, at least one request per partition
    assert s.value("fluvial_kafka_request_duration_seconds_count", api="produce") == produced
    assert s.value("fluvial_kafka_request_duration_seconds_bucket", api="produce", le="+Inf") == produced
    assert s.value("fluvial_kafka_request_duration_seconds_sum", api="produce") > 0
    assert s.value("fluvial_kafka_requests_total", api="join_group") >= 1
    assert s.value("fluvial_kafka_requests_total", api="offset_commit") >= 2
    assert s.value("fluvial_kafka_response_errors_total", api="produce", error="message_too_large") >= 1
    assert s.families["fluvial_kafka_request_duration_seconds"].type == "histogram"
    # Flush policy ack: every acks=all produce waited for an fsync.
    assert s.value("fluvial_log_fsync_duration_seconds_count") >= 2
    assert s.value("fluvial_event_loop_lag_seconds_count") > 0
    assert s.value("process_resident_memory_bytes") > 10_000_000
    assert s.value("fluvial_tables") == 2


def test_kv_and_remote_log_metrics(fresh_broker, topic_name):
    b = fresh_broker(*FAST_TIERING)
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("qty", pa.int64())])
    with connect(b.flight_url) as client:
        users = client.create_table(f"{topic_name}-pk", schema, buckets=2, primary_key=["id"])
        users.upsert(pa.table({"id": pa.array(range(40), pa.int64()), "qty": pa.array([1] * 40, pa.int64())}))
        users.upsert(pa.table({"id": pa.array(range(10), pa.int64()), "qty": pa.array([2] * 10, pa.int64())}))
        assert users.lookup([{"id": 1}, {"id": 2}, {"id": 99}]).num_rows == 2
        assert users.scan(columns=["id"]).to_arrow().num_rows == 60  # the changelog, from the broker
        tiered = client.create_table(topic_name, configs={"segment.bytes": "16384", "local.retention.ms": "0",
                                                         "remote.storage.enable": "true"})
        for _ in range(8):
            tiered.append(pa.table({"value": [b"r" * 1000] * 10}))

    deadline = time.monotonic() + 60
    while True:
        s = Scrape(b.http_url)
        remote = s.value("fluvial_bucket_segments", table=topic_name, bucket="0", tier="remote")
        if remote >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert remote >= 2
    # The remote size is the uploaded segments' bytes (their Parquet files, not the local
    # bytes), read once the listing and the scrape agree on how many there are.
    with connect(b.flight_url) as client:
        deadline = time.monotonic() + 30
        while True:
            listing = client._action("remote-segments", {"name": topic_name, "table": topic_name, "bucket": 0,
                                                         "start": 0})["segments"]
            s = Scrape(b.http_url)
            counted = s.value("fluvial_bucket_segments", table=topic_name, bucket="0", tier="remote")
            if counted == len(listing) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert counted == len(listing) >= 2
    assert s.value("fluvial_bucket_size_bytes", table=topic_name, bucket="0", tier="remote") == \
        sum(segment["size_bytes"] for segment in listing) > 0
    assert s.value("fluvial_bucket_high_watermark", table=topic_name, bucket="0") == 80
    # What is not yet tiered: at most the active segment.
    assert 0 <= s.value("fluvial_remote_log_lag_records", table=topic_name, bucket="0") < 80
    assert s.value("fluvial_remote_log_upload_failures", table=topic_name, bucket="0") == 0

    # The console shows the same remote log: the tiering page and the table's buckets.
    with urllib.request.urlopen(f"{b.http_url}/console/tiering", timeout=30) as r:
        page = r.read().decode()
    assert f'/console/tables/{topic_name}">{topic_name}</a>' in page and "0 failure(s)" in page

    pk = f"{topic_name}-pk"
    assert s.value("fluvial_kv_lookups_total", table=pk) == 1
    assert s.value("fluvial_kv_lookup_keys_total", table=pk) == 3
    assert sum(s.values("fluvial_kv_tablet_keys", table=pk)) >= 40
    assert sum(s.values("fluvial_kv_tablet_size_bytes", table=pk)) > 0
    assert {x.labels["merge_engine"] for x in s.samples if x.name == "fluvial_kv_tablet_keys"} == {"last_row"}
    # 40 inserts and 10 updates (-U/+U each): 60 changelog rows over the two buckets.
    assert sum(s.values("fluvial_kv_tablet_applied_offset", table=pk)) == 60
    assert s.value("fluvial_table_records_in_total", table=pk) == 60
    assert s.value("fluvial_table_scan_records_out_total", table=pk) == 60
    assert s.value("fluvial_table_scan_bytes_out_total", table=pk) >= 60 * 8
    assert s.value("fluvial_table_records_out_total", table=pk) == 0  # no Kafka consumer


def test_metrics_endpoint_is_not_confused_by_bad_requests(broker):
    for path, status in (("/metrics?x=1", 200), ("/metricsx", 404)):
        try:
            with urllib.request.urlopen(f"{broker.http_url}{path}", timeout=10) as r:
                code = r.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        assert code == status, path
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(urllib.request.Request(f"{broker.http_url}/metrics", method="POST"), timeout=10)
    assert info.value.code == 405


def test_requests_that_close_the_connection_are_counted_as_failures(broker):
    import socket
    import struct
    host, port = broker.bootstrap.split(":")

    def unknown_failures() -> float:
        return sum(Scrape(broker.http_url).values("fluvial_kafka_request_failures_total", api="unknown"))

    before = unknown_failures()
    # API key 31337 does not exist: Kafka's answer is closing the connection. Keys that name
    # no API are counted under one label, so garbled frames cannot grow the label set.
    header = struct.pack(">hhi", 31337, 0, 7) + struct.pack(">h", 4) + b"test"
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(header)) + header)
        assert s.recv(10) == b""  # closed
    deadline = time.monotonic() + 10
    while unknown_failures() != before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not Scrape(broker.http_url).values("fluvial_kafka_request_failures_total", api="31337")


def test_lake_lag_metrics_fall_to_zero_after_a_tiering_round(fresh_broker, topic_name):
    from fluvial.tiering.lake.job import TieringWorker
    b = fresh_broker()
    schema = pa.schema([pa.field("id", pa.int64(), False)])
    with connect(b.flight_url) as client:
        t = client.create_table(topic_name, schema, buckets=2, lake=True)
        t.append(pa.table({"id": pa.array(range(30), pa.int64())}, schema=schema))
    s = Scrape(b.http_url)
    assert s.value("fluvial_lake_lag_records", table=topic_name) == 30
    assert s.value("fluvial_lake_lag_seconds", table=topic_name) >= 0
    assert s.value("fluvial_lake_tiering_rounds_total", table=topic_name) == 0

    assert TieringWorker(b.flight_url, job="metrics-test").run_once().rows == 30
    s = Scrape(b.http_url)
    assert s.value("fluvial_lake_lag_records", table=topic_name) == 0
    assert s.value("fluvial_lake_lag_seconds", table=topic_name) == 0
    assert s.value("fluvial_lake_tiering_rounds_total", table=topic_name) == 1
    # The console's tiering page shows the same state.
    with urllib.request.urlopen(f"{b.http_url}/console/tiering", timeout=30) as r:
        page = r.read().decode()
    assert topic_name in page and ">tiered<" in page
