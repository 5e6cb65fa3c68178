"""Idempotent producers against a broker whose connections are cut mid-request.

A TCP proxy between the clients and the broker forwards every request but, now and
then, drops the connection instead of passing a Produce response back: the batch was
written, the producer never heard so, and retries it. The log must hold it once.
"""
from __future__ import annotations

import asyncio
import collections
import json
import socket
import struct
import threading
import time

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.record import MemoryRecordsBuilder

from fluvial.client import connect
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class

PROXY_HOST = "127.0.0.2"  # the broker advertises this address; the proxy listens on it


class ResponseDroppingProxy:
    """Forwards Kafka connections; cuts every `every`-th Produce response (after the
    broker has handled the request, before the client sees the answer)."""

    def __init__(self, listen_host: str, port: int, upstream: tuple[str, int], every: int):
        self.listen = (listen_host, port)
        self.upstream = upstream
        self.every = every
        self.cutting = False
        self.produce_responses = 0
        self.cut = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ResponseDroppingProxy":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task] = set()

        def on_client(r, w):
            task = asyncio.ensure_future(self._on_client(r, w))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

        server = await asyncio.start_server(on_client, *self.listen)
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(handlers):
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _on_client(self, client_r, client_w) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        api_by_correlation: dict[int, int] = {}

        async def requests():
            while True:
                head = await client_r.readexactly(4)
                (size,) = struct.unpack(">i", head)
                body = await client_r.readexactly(size)
                api_key, _version, correlation = struct.unpack_from(">hhi", body, 0)
                api_by_correlation[correlation] = api_key
                up_w.write(head + body)
                await up_w.drain()

        async def responses():
            while True:
                head = await up_r.readexactly(4)
                (size,) = struct.unpack(">i", head)
                body = await up_r.readexactly(size)
                (correlation,) = struct.unpack_from(">i", body, 0)
                if api_by_correlation.pop(correlation, None) == ApiKey.PRODUCE and self.cutting:
                    self.produce_responses += 1
                    if self.produce_responses % self.every == 0:
                        self.cut += 1
                        return  # the written batch's answer is lost with the connection
                client_w.write(head + body)
                await client_w.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(responses())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (client_w, up_w):
                w.close()


def loopback_alias_usable() -> bool:
    try:
        with socket.socket() as s:
            s.bind((PROXY_HOST, 0))
        return True
    except OSError:
        return False


needs_alias = pytest.mark.skipif(not loopback_alias_usable(), reason=f"cannot bind {PROXY_HOST}")


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout: float = 60):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = c.consume(1000, timeout=1.0)
        for m in batch:
            assert m.error() is None, m.error()
            got.append((m.partition(), m.offset(), m.value()))
        if len(got) >= expected and not batch:
            break
    c.close()
    return got


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def assert_exactly_once_in_order(got, n: int, partitions: int):
    values = [v for _, _, v in got]
    counts = collections.Counter(values)
    dups = {v: c for v, c in counts.items() if c > 1}
    assert not dups, f"{len(dups)} values written more than once, e.g. {list(dups.items())[:5]}"
    assert set(values) == {f"v-{i}".encode() for i in range(n)}
    for p in range(partitions):
        offsets = [o for part, o, _ in got if part == p]
        assert offsets == list(range(len(offsets))), "offsets of a partition must be dense"
        seq = [int(v.split(b"-")[1]) for part, _, v in got if part == p]
        assert seq == sorted(seq), "an idempotent producer keeps its order within a partition"


@needs_alias
def test_kafka_python_idempotent_producer_survives_cut_connections(fresh_broker, topic_name):
    broker = fresh_broker("--advertised-host", PROXY_HOST)
    partitions, n = 3, 3000
    with ResponseDroppingProxy(PROXY_HOST, broker.port, ("127.0.0.1", broker.port), every=7) as proxy:
        create_topic(broker.bootstrap, topic_name, partitions)
        proxy.cutting = True
        producer = KafkaProducer(bootstrap_servers=f"{PROXY_HOST}:{broker.port}", acks="all", linger_ms=5,
                                 batch_size=4096, retries=2**31 - 1, retry_backoff_ms=50,
                                 request_timeout_ms=5000, delivery_timeout_ms=120_000)
        assert producer.config["enable_idempotence"], "kafka-python 3 enables idempotence by default"
        futures = []
        for i in range(n):
            futures.append(producer.send(topic_name, value=f"v-{i}".encode(), partition=i % partitions))
            if i % 20 == 0:
                time.sleep(0.005)  # spread the records over many produce requests
        producer.flush(120)
        for f in futures:
            f.get(timeout=1)  # every record was acknowledged in the end
        producer.close(5)
        proxy.cutting = False
        assert proxy.cut >= 3, "the proxy must actually have cut connections for this test to mean anything"
        got = read_all(broker.bootstrap, topic_name, partitions, n)
    assert_exactly_once_in_order(got, n, partitions)


@needs_alias
def test_librdkafka_idempotent_producer_survives_cut_connections(fresh_broker, topic_name):
    broker = fresh_broker("--advertised-host", PROXY_HOST)
    partitions, n = 2, 3000
    with ResponseDroppingProxy(PROXY_HOST, broker.port, ("127.0.0.1", broker.port), every=5) as proxy:
        create_topic(broker.bootstrap, topic_name, partitions)
        proxy.cutting = True
        errors = []
        p = Producer({"bootstrap.servers": f"{PROXY_HOST}:{broker.port}", "enable.idempotence": True,
                      "linger.ms": 5, "batch.num.messages": 50, "socket.timeout.ms": 5000,
                      "message.timeout.ms": 120_000})
        for i in range(n):
            p.produce(topic_name, value=f"v-{i}".encode(), partition=i % partitions,
                      on_delivery=lambda err, msg: err and errors.append(err))
            p.poll(0)
            if i % 20 == 0:
                time.sleep(0.005)
        assert p.flush(120) == 0
        assert not errors, errors[:5]
        proxy.cutting = False
        assert proxy.cut >= 3
        got = read_all(broker.bootstrap, topic_name, partitions, n)
    assert_exactly_once_in_order(got, n, partitions)


# -- the produce path's answers, request by request ---------------------------------------


class RawClient:
    """One blocking connection speaking framed Kafka requests."""

    def __init__(self, bootstrap: str):
        host, port = bootstrap.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=15)
        self.correlation = 0

    def call(self, api_key: int, version: int, body: dict):
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, body))
        (size,) = struct.unpack(">i", self._read(4))
        correlation, response = decode_response(api_key, version, self._read(size))
        assert correlation == self.correlation
        return response

    def _read(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed by the broker"
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


def batch(pid: int, epoch: int, base_seq: int, values: list[bytes], keys: list[bytes] | None = None) -> bytes:
    b = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20,
                             producer_id=pid, producer_epoch=epoch, base_sequence=base_seq)
    for i, v in enumerate(values):
        b.append(timestamp=int(time.time() * 1000), key=None if keys is None else keys[i], value=v, headers=[])
    b.close()
    return bytes(b.buffer())


def produce(client: RawClient, topic: str, records: bytes):
    Topic = request_class(ApiKey.PRODUCE).TopicProduceData
    r = client.call(ApiKey.PRODUCE, 9, dict(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=records)])]))
    part = r.responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def test_duplicates_gaps_and_stale_epochs_get_kafkas_answers(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    c = RawClient(broker.bootstrap)
    init = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=None, transaction_timeout_ms=60_000,
                                                   producer_id=-1, producer_epoch=-1))
    assert init.error_code == 0 and init.producer_id >= 0 and init.producer_epoch == 0
    pid = init.producer_id
    first = batch(pid, 0, 0, [b"a", b"b", b"c"])
    assert produce(c, topic_name, first) == (0, 0)
    assert produce(c, topic_name, batch(pid, 0, 3, [b"d"])) == (0, 3)
    # A retry of either batch is answered with where it was written, and not written again.
    assert produce(c, topic_name, first) == (0, 0)
    assert produce(c, topic_name, batch(pid, 0, 3, [b"d"])) == (0, 3)
    # A gap in the sequence is refused.
    err, _ = produce(c, topic_name, batch(pid, 0, 9, [b"x"]))
    assert err == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    # A new epoch must start at sequence 0; after it, the old epoch is fenced.
    err, _ = produce(c, topic_name, batch(pid, 1, 4, [b"y"]))
    assert err == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert produce(c, topic_name, batch(pid, 1, 0, [b"e"])) == (0, 4)
    err, _ = produce(c, topic_name, batch(pid, 0, 4, [b"z"]))
    assert err == ErrorCode.INVALID_PRODUCER_EPOCH
    # Another producer id is independent; ids are never handed out twice.
    other = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=None, transaction_timeout_ms=60_000,
                                                    producer_id=-1, producer_epoch=-1))
    assert other.producer_id != pid
    c.close()
    got = read_all(broker.bootstrap, topic_name, 1, 5)
    assert [v for _, _, v in got] == [b"a", b"b", b"c", b"d", b"e"]


def test_transactional_id_epoch_bump_fences_the_old_instance(broker):
    c = RawClient(broker.bootstrap)
    tx = f"tx-{time.monotonic_ns()}"
    a = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=tx, transaction_timeout_ms=60_000,
                                                producer_id=-1, producer_epoch=-1))
    b = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=tx, transaction_timeout_ms=60_000,
                                                producer_id=-1, producer_epoch=-1))
    assert a.error_code == b.error_code == 0
    assert b.producer_id == a.producer_id and b.producer_epoch == a.producer_epoch + 1
    stale = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=tx, transaction_timeout_ms=60_000,
                                                    producer_id=a.producer_id, producer_epoch=a.producer_epoch))
    assert stale.error_code == ErrorCode.PRODUCER_FENCED
    old = c.call(ApiKey.INIT_PRODUCER_ID, 3, dict(transactional_id=tx, transaction_timeout_ms=60_000,
                                                  producer_id=a.producer_id, producer_epoch=a.producer_epoch))
    assert old.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    c.close()


def test_producer_state_survives_broker_restart(fresh_broker, topic_name):
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name, 1)
    c = RawClient(broker.bootstrap)
    pid = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=None, transaction_timeout_ms=60_000,
                                                  producer_id=-1, producer_epoch=-1)).producer_id
    batches = [batch(pid, 0, 2 * i, [b"%d" % (2 * i), b"%d" % (2 * i + 1)]) for i in range(4)]
    for i, b in enumerate(batches):
        assert produce(c, topic_name, b) == (0, 2 * i)
    c.close()
    for restart in (broker.restart, broker.kill9):
        # Clean stop (snapshot) and kill -9 (rebuild from the log) alike.
        restart()
        if not broker.alive():
            broker.start()
        c = RawClient(broker.bootstrap)
        assert produce(c, topic_name, batches[3]) == (0, 6)
        assert produce(c, topic_name, batches[2]) == (0, 4)
        err, _ = produce(c, topic_name, batch(pid, 0, 100, [b"gap"]))
        assert err == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        c.close()
    ids_after = RawClient(broker.bootstrap)
    again = ids_after.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=None, transaction_timeout_ms=60_000,
                                                            producer_id=-1, producer_epoch=-1))
    assert again.producer_id > pid
    ids_after.close()
    assert len(read_all(broker.bootstrap, topic_name, 1, 8)) == 8


# -- identical retries after kill -9 -----------------------------------------------------


def init_producer(c: RawClient) -> int:
    init = c.call(ApiKey.INIT_PRODUCER_ID, 4, dict(transactional_id=None, transaction_timeout_ms=60_000,
                                                   producer_id=-1, producer_epoch=-1))
    assert init.error_code == 0
    return init.producer_id


def pk_batch(pid: int, base_seq: int, n: int, keys: int, tag: str) -> bytes:
    """n JSON upserts over `keys` keys: the changelog gets +I for a new key, -U/+U for an update."""
    ks = [json.dumps({"id": i % keys}, separators=(",", ":")).encode() for i in range(n)]
    vs = [json.dumps({"id": i % keys, "v": f"{tag}-{i}"}, separators=(",", ":")).encode() for i in range(n)]
    return batch(pid, 0, base_seq, vs, ks)


def create_pk_table(broker, name: str) -> None:
    schema = pa.schema([pa.field("id", pa.int64(), False), pa.field("v", pa.string())])
    with connect(broker.flight_url) as client:
        client.create_table(name, schema, buckets=1, kafka_format="json", primary_key=["id"])


@pytest.mark.parametrize("snapshot", [False, True], ids=["replay", "snapshot"])
def test_pk_table_retry_after_kill9_gets_the_original_offset(fresh_broker, topic_name, snapshot):
    """20 records over 5 keys make a 35-row changelog (5 +I, 15 -U/+U pairs): the producer's
    sequence span (20) and the stored rows (35) differ, and a retry after kill -9 must still
    be recognised, from the log alone or from a producer-state snapshot."""
    broker = fresh_broker()
    create_pk_table(broker, topic_name)
    c = RawClient(broker.bootstrap)
    pid = init_producer(c)
    first = pk_batch(pid, 0, 20, 5, "a")
    second = pk_batch(pid, 20, 20, 5, "b")       # only updates: 40 changelog rows
    # The rows each key already has: no change, no changelog row, nothing in the log.
    noop = batch(pid, 0, 40, [json.dumps({"id": k, "v": f"b-{15 + k}"}, separators=(",", ":")).encode()
                             for k in range(5)],
                 [json.dumps({"id": k}, separators=(",", ":")).encode() for k in range(5)])
    assert produce(c, topic_name, first) == (0, 0)
    assert produce(c, topic_name, second) == (0, 35)
    assert produce(c, topic_name, noop) == (0, 75)
    c.close()
    if snapshot:
        broker.restart()  # a clean stop writes the snapshot; kill -9 then finds it
        broker.kill9()
    else:
        broker.kill9()
    broker.start()
    c = RawClient(broker.bootstrap)
    for b, where in ((first, 0), (second, 35)):
        assert produce(c, topic_name, b) == (0, where)
    # The producer goes on after the no-op, which only a snapshot remembers; a retry of
    # the no-op is still a duplicate (applying it now would change every key back).
    assert produce(c, topic_name, pk_batch(pid, 45, 5, 5, "c")) == (0, 75)
    assert produce(c, topic_name, noop) == (0, 75)
    # A gap is still refused.
    err, _ = produce(c, topic_name, pk_batch(pid, 99, 1, 5, "d"))
    assert err == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    c.close()
    with connect(broker.flight_url) as client:
        t = client.table(topic_name)
        rows = {r["id"]: r["v"] for r in t.full_read().rows.to_pylist()}
        assert rows == {k: f"c-{k}" for k in range(5)}
        assert t.offsets()[0].high_watermark == 85  # nothing was written twice


def test_log_table_retry_in_flight_across_kill9_gets_the_original_offset(fresh_broker, topic_name):
    """Batches written but never answered (the broker died first) are retried after the
    restart: each gets where it was written, the next one continues the sequence."""
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name, 1)
    c = RawClient(broker.bootstrap)
    pid = init_producer(c)
    batches = [batch(pid, 0, 3 * i, [b"%d-%d" % (i, j) for j in range(3)]) for i in range(5)]
    Topic = request_class(ApiKey.PRODUCE).TopicProduceData
    # Pipelined without reading the answers, as a client with 5 requests in flight does.
    for i, b in enumerate(batches):
        c.correlation += 1
        c.sock.sendall(encode_request(ApiKey.PRODUCE, 9, c.correlation, dict(
            transactional_id=None, acks=-1, timeout_ms=10_000,
            topic_data=[Topic(name=topic_name, partition_data=[Topic.PartitionProduceData(index=0, records=b)])])))
    deadline = time.monotonic() + 10
    while end_offset(broker, topic_name) < 15 and time.monotonic() < deadline:
        time.sleep(0.05)
    broker.kill9()
    c.close()
    broker.start()
    c = RawClient(broker.bootstrap)
    for i in (0, 3, 4):
        assert produce(c, topic_name, batches[i]) == (0, 3 * i)
    assert produce(c, topic_name, batch(pid, 0, 15, [b"next"])) == (0, 15)
    c.close()
    assert [v for _, _, v in read_all(broker.bootstrap, topic_name, 1, 16)][-2:] == [b"4-2", b"next"]


def end_offset(broker, topic: str) -> int:
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
    finally:
        c.close()
