"""Coalesced appends (written off the event loop, one flush window at a time) mixed with large
batches appended from the produce path's threads, on one partition, through the Kafka
listener: every acknowledged record is read back at the offset its answer gave, the offsets
dense, each value byte for byte."""
from __future__ import annotations

import threading

from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class
from tests.integration.test_idempotence import RawClient, batch, create_topic, read_all

SMALL_PRODUCERS = 6
SMALL_BATCHES = 80
LARGE_BATCHES = 12
# Over the 256 KiB a coalesced append may be: appended at once (in a thread), not coalesced.
LARGE_RECORDS, LARGE_VALUE = 3, 100_000


def _pipelined(client: RawClient, topic: str, batches: list[tuple[bytes, list[bytes]]], acked: list,
               errors: list) -> None:
    """Send every batch without waiting, then read the answers in order."""
    Topic = request_class(ApiKey.PRODUCE).TopicProduceData
    try:
        for wire, _ in batches:
            client.correlation += 1
            client.sock.sendall(encode_request(ApiKey.PRODUCE, 9, client.correlation, dict(
                transactional_id=None, acks=-1, timeout_ms=30_000,
                topic_data=[Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=wire)])])))
        for _, values in batches:
            size = int.from_bytes(client._read(4), "big")
            _, response = decode_response(ApiKey.PRODUCE, 9, client._read(size))
            part = response.responses[0].partition_responses[0]
            if part.error_code:
                errors.append(part.error_code)
            else:
                acked.append((part.base_offset, values))
    except Exception as exc:  # reported by the test, not lost in the thread
        errors.append(exc)


def test_coalesced_and_large_appends_on_one_partition_keep_their_answered_offsets(broker, topic_name):
    create_topic(broker.bootstrap, topic_name, 1)
    work = [[(batch(-1, -1, -1, [v]), [v]) for v in (b"s%d-%d" % (n, i) for i in range(SMALL_BATCHES))]
            for n in range(SMALL_PRODUCERS)]
    large = []
    for i in range(LARGE_BATCHES):
        values = [(b"L%d-%d:" % (i, r)).ljust(LARGE_VALUE, b"x") for r in range(LARGE_RECORDS)]
        large.append((batch(-1, -1, -1, values), values))
    work.append(large)
    clients = [RawClient(broker.bootstrap) for _ in work]
    acked: list = []
    errors: list = []
    threads = [threading.Thread(target=_pipelined, args=(c, topic_name, w, acked, errors))
               for c, w in zip(clients, work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for c in clients:
        c.close()
    assert not errors, errors
    expected = {}
    for base, values in acked:
        for k, v in enumerate(values):
            expected[base + k] = v
    total = SMALL_PRODUCERS * SMALL_BATCHES + LARGE_BATCHES * LARGE_RECORDS
    assert len(expected) == total, "two answers gave the same offset"
    got = read_all(broker.bootstrap, topic_name, 1, total)
    assert [o for _, o, _ in got] == list(range(total)), "offsets must be dense and in order"
    for _, offset, value in got:
        assert value == expected[offset], offset
