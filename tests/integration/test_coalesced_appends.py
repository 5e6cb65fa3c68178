"""Coalesced appends through the Kafka listener: many one-record acks=all producers, kill -9.

Pipelined one-record batches from several idempotent producers land in one flush window
and are stored as coalesced messages. The broker is killed with kill -9 while they come
in; after the restart every acknowledged record is where its answer said, nothing is
there twice, and an identical retry of an acknowledged batch gets the duplicate answer
with its original offset.
"""
from __future__ import annotations

import threading
import time

import pyarrow.ipc as ipc

from fluvial.broker.log.segment_format import PARTS_KEY
from fluvial.protocol.messages import ApiKey, decode_response, encode_request, request_class
from tests.integration.test_idempotence import RawClient, batch, create_topic, init_producer, produce, read_all

PRODUCERS = 8
BATCHES = 60


def _pipelined(client: RawClient, topic: str, batches: list[bytes], acked: dict, index: int) -> None:
    """Send every batch without waiting, then read the answers in order (until the broker dies)."""
    Topic = request_class(ApiKey.PRODUCE).TopicProduceData
    try:
        for b in batches:
            client.correlation += 1
            client.sock.sendall(encode_request(ApiKey.PRODUCE, 9, client.correlation, dict(
                transactional_id=None, acks=-1, timeout_ms=10_000,
                topic_data=[Topic(name=topic, partition_data=[Topic.PartitionProduceData(index=0, records=b)])])))
        for i in range(len(batches)):
            size = int.from_bytes(client._read(4), "big")
            _, response = decode_response(ApiKey.PRODUCE, 9, client._read(size))
            part = response.responses[0].partition_responses[0]
            assert part.error_code == 0, part
            acked[(index, i)] = part.base_offset
    except (OSError, AssertionError):
        pass  # the broker was killed


def test_kill9_amid_coalesced_appends_keeps_every_acknowledged_record(fresh_broker, topic_name):
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name, 1)
    clients = [RawClient(broker.bootstrap) for _ in range(PRODUCERS)]
    pids = [init_producer(c) for c in clients]
    batches = [[batch(pid, 0, i, [b"p%d-%d" % (n, i)]) for i in range(BATCHES)] for n, pid in enumerate(pids)]
    acked: dict = {}
    threads = [threading.Thread(target=_pipelined, args=(c, topic_name, batches[n], acked, n))
               for n, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(acked) < PRODUCERS * BATCHES // 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    broker.kill9()
    for t in threads:
        t.join(20)
    for c in clients:
        c.close()
    assert acked, "nothing was acknowledged before the kill"

    # The segment holds coalesced messages (several Kafka batches in one IPC message).
    [segment] = sorted((broker.data_dir / "log").glob(f"{topic_name}-0/*.arrows"))
    with ipc.open_stream(segment) as reader:
        parts = [m.custom_metadata.get(PARTS_KEY, b"") for m in reader.iter_batches_with_custom_metadata()]
    assert any(p.count(b"\n") >= 1 for p in parts), "no coalesced message was written"

    broker.start()
    got = read_all(broker.bootstrap, topic_name, 1, len(acked))
    offsets = {value: offset for _, offset, value in got}
    assert len(offsets) == len(got), "a record is in the log twice"
    assert [o for _, o, _ in got] == list(range(len(got))), "offsets must be dense"
    for (n, i), offset in acked.items():
        assert offsets.get(b"p%d-%d" % (n, i)) == offset, (n, i)
    # An identical retry of each of a producer's last five batches in the log (the ones
    # Kafka's producer state remembers; kill -9 keeps what was written but not yet
    # answered too) is a duplicate: its original offset, nothing written again.
    c = RawClient(broker.bootstrap)
    for n in range(PRODUCERS):
        mine = sorted(int(v.split(b"-")[1]) for v in offsets if v.startswith(b"p%d-" % n))
        assert mine == list(range(len(mine))), "a producer's batches are in the log in order, without gaps"
        for i in mine[-5:]:
            assert produce(c, topic_name, batches[n][i]) == (0, offsets[b"p%d-%d" % (n, i)]), (n, i)
    c.close()
    again = read_all(broker.bootstrap, topic_name, 1, len(got))
    assert len(again) == len(got)


def test_duplicates_of_coalesced_batches_are_found_after_a_clean_restart(fresh_broker, topic_name):
    """Producer state comes back from its snapshot (written on stop) plus the coalesced
    messages after it: retries of each producer's last batches get their original offsets,
    and the next sequence is appended at the log end."""
    broker = fresh_broker()
    create_topic(broker.bootstrap, topic_name, 1)
    clients = [RawClient(broker.bootstrap) for _ in range(4)]
    pids = [init_producer(c) for c in clients]
    n = 20
    batches = [[batch(pid, 0, i, [b"q%d-%d" % (k, i)]) for i in range(n)] for k, pid in enumerate(pids)]
    acked: dict = {}
    threads = [threading.Thread(target=_pipelined, args=(c, topic_name, batches[k], acked, k))
               for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in clients:
        c.close()
    assert len(acked) == 4 * n
    broker.stop()
    parts = []
    for segment in sorted((broker.data_dir / "log").glob(f"{topic_name}-0/*.arrows")):
        with ipc.open_stream(segment) as reader:
            parts += [m.custom_metadata.get(PARTS_KEY, b"") for m in reader.iter_batches_with_custom_metadata()]
    assert any(p.count(b"\n") >= 1 for p in parts), "no coalesced message was written"
    broker.start()
    c = RawClient(broker.bootstrap)
    for k in range(4):
        for i in range(n - 5, n):
            assert produce(c, topic_name, batches[k][i]) == (0, acked[(k, i)]), (k, i)
    for k, pid in enumerate(pids):
        assert produce(c, topic_name, batch(pid, 0, n, [b"next-%d" % k])) == (0, 4 * n + k)
    c.close()
    assert len(read_all(broker.bootstrap, topic_name, 1, 4 * n + 4)) == 4 * n + 4
