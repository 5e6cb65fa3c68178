"""The raw produce path with large frames (received into their own buffer, the batch patched
and cached in place, broker/frames.py): batches fetched back are the produced bytes, with
only the broker's base offset and leader epoch stamped in, for pipelined requests and for
requests carrying several partitions."""
from __future__ import annotations

import os
import struct
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.record.default_records import DefaultRecordBatchBuilder

from fluvial.broker.frames import DIRECT_FRAME_BYTES
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class
from tests.integration.test_bad_input import RawClient

P = request_class(ApiKey.PRODUCE)
F = request_class(ApiKey.FETCH)


def _batch(n: int, size: int, seed: int) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for i in range(n):
        key = None if i % 3 else f"k{seed}-{i}".encode()
        b.append(i, timestamp=1_700_000_000_000 + i, key=key, value=os.urandom(size),
                 headers=[("h", b"x")] if i % 5 == 0 else [])
    return bytes(b.build())


def _produce(topic: str, batches: dict[int, bytes]) -> dict:
    return dict(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[P.TopicProduceData(
        name=topic, partition_data=[P.TopicProduceData.PartitionProduceData(index=i, records=b)
                                    for i, b in batches.items()])])


def _fetch(client: RawClient, topic: str, partition: int, offset: int) -> bytes:
    r = client.request(ApiKey.FETCH, 11, dict(
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=50 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, rack_id="", forgotten_topics_data=[], topics=[F.FetchTopic(topic=topic, partitions=[
            F.FetchTopic.FetchPartition(partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                                        log_start_offset=-1, partition_max_bytes=50 << 20)])]))
    (t,) = r.responses
    (p,) = t.partitions
    assert p.error_code == 0
    return bytes(p.records)


def _same_batch(fetched: bytes, produced: bytes, base_offset: int) -> None:
    """The produced batch as fetched: only base offset (0-8) and leader epoch (12-16) differ."""
    assert len(fetched) >= len(produced)
    got = fetched[:len(produced)]
    assert struct.unpack_from(">q", got, 0)[0] == base_offset
    assert got[8:12] == produced[8:12] and got[16:] == produced[16:]


@pytest.fixture
def topic2(broker, topic_name):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 2, 1)])[topic_name].result(10)
    return topic_name


def test_large_pipelined_batches_fetch_back_identical(broker, topic2):
    big = [_batch(300, 1000, s) for s in range(3)]
    assert all(len(b) > 4 * DIRECT_FRAME_BYTES for b in big)
    c = RawClient(broker.bootstrap)
    # Sent back to back before any answer: later frames arrive while earlier ones are handled.
    frames = [encode_request(ApiKey.PRODUCE, 9, 100 + i, _produce(topic2, {0: b})) for i, b in enumerate(big)]
    c.send_raw(b"".join(frames))
    for i in range(3):
        cid, r = decode_response(ApiKey.PRODUCE, 9, c.read_frame())
        assert cid == 100 + i
        (p,) = r.responses[0].partition_responses
        assert p.error_code == 0 and p.base_offset == 300 * i
    for i, b in enumerate(big):
        _same_batch(_fetch(c, topic2, 0, 300 * i), b, 300 * i)
    c.close()


def test_several_partitions_in_one_large_frame(broker, topic2):
    big, small = _batch(200, 1000, 7), _batch(3, 10, 8)
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, _produce(topic2, {0: big, 1: small}))
    assert [p.error_code for p in r.responses[0].partition_responses] == [0, 0]
    _same_batch(_fetch(c, topic2, 0, 0), big, 0)
    _same_batch(_fetch(c, topic2, 1, 0), small, 0)
    # A second round of the same: offsets follow on, bytes still identical.
    r = c.request(ApiKey.PRODUCE, 9, _produce(topic2, {1: big, 0: small}))
    assert [p.error_code for p in r.responses[0].partition_responses] == [0, 0]
    _same_batch(_fetch(c, topic2, 1, 3), big, 3)
    _same_batch(_fetch(c, topic2, 0, 200), small, 200)
    c.close()


def test_corrupt_large_batch_is_refused_and_the_connection_goes_on(broker, topic2):
    bad = bytearray(_batch(100, 1000, 9))
    bad[-5] ^= 0xFF  # inside the records: the CRC no longer matches
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, _produce(topic2, {0: bytes(bad)}))
    (p,) = r.responses[0].partition_responses
    assert p.error_code == 2  # CORRUPT_MESSAGE
    good = _batch(100, 1000, 10)
    r = c.request(ApiKey.PRODUCE, 9, _produce(topic2, {0: good}))
    (p,) = r.responses[0].partition_responses
    assert p.error_code == 0 and p.base_offset == 0
    _same_batch(_fetch(c, topic2, 0, 0), good, 0)
    c.close()


def test_large_batch_appended_off_the_loop_wakes_a_waiting_consumer(fresh_broker, topic_name):
    """Flush policy none: a batch appended on the executor is visible at once, and a fetch
    already long-polling for it is answered without waiting out its max wait."""
    broker = fresh_broker("--flush-policy", "none")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic_name, 1, 1)])[topic_name].result(10)
    big = _batch(300, 1000, 11)
    waited: list[float] = []
    got: list[bytes] = []

    def long_poll() -> None:
        c = RawClient(broker.bootstrap)
        started = time.monotonic()
        r = c.request(ApiKey.FETCH, 11, dict(
            replica_id=-1, max_wait_ms=8000, min_bytes=1, max_bytes=50 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, rack_id="", forgotten_topics_data=[], topics=[F.FetchTopic(topic=topic_name, partitions=[
                F.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                            log_start_offset=-1, partition_max_bytes=50 << 20)])]))
        waited.append(time.monotonic() - started)
        got.append(bytes(r.responses[0].partitions[0].records))
        c.close()

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)  # the fetch is waiting by now
    c = RawClient(broker.bootstrap)
    r = c.request(ApiKey.PRODUCE, 9, _produce(topic_name, {0: big}))
    assert r.responses[0].partition_responses[0].error_code == 0
    poller.join(15)
    assert waited and waited[0] < 4, f"the waiting fetch was answered after {waited}"
    _same_batch(got[0], big, 0)
    c.close()
