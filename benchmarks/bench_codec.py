"""Cost per request of the message codec: kafka-python 3's generated classes vs hand-written.

Decodes a Produce v9 request and encodes a Fetch v12 response (the two messages on every
hot path) with both, median of 5 runs, and saves benchmarks/results/codec.json.
The hand-written versions here exist only as the yardstick of the decision recorded in
docs/architecture.md ("Protocol codec").
"""
from __future__ import annotations

import json
import statistics
import struct
import time
from pathlib import Path

from fluvial.protocol.messages import ApiKey, encode_request, request_class, response_class

PARTITIONS = 6
RECORDS = b"\x00" * 16384


def uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    r = s = 0
    while True:
        b = buf[pos]
        pos += 1
        r |= (b & 0x7F) << s
        if b < 0x80:
            return r, pos
        s += 7


def compact_str(buf, pos):
    n, pos = uvarint(buf, pos)
    if n == 0:
        return None, pos
    return bytes(buf[pos:pos + n - 1]).decode(), pos + n - 1


def skip_tags(buf, pos):
    n, pos = uvarint(buf, pos)
    for _ in range(n):
        _, pos = uvarint(buf, pos)
        size, pos = uvarint(buf, pos)
        pos += size
    return pos


def hand_decode_produce_v9(buf: memoryview):
    tid, pos = compact_str(buf, 0)
    acks, timeout = struct.unpack_from(">hi", buf, pos)
    pos += 6
    ntopics, pos = uvarint(buf, pos)
    topics = []
    for _ in range(ntopics - 1):
        name, pos = compact_str(buf, pos)
        nparts, pos = uvarint(buf, pos)
        parts = []
        for _ in range(nparts - 1):
            (index,) = struct.unpack_from(">i", buf, pos)
            pos += 4
            n, pos = uvarint(buf, pos)
            parts.append((index, buf[pos:pos + n - 1]))
            pos = skip_tags(buf, pos + n - 1)
        topics.append((name, parts))
        pos = skip_tags(buf, pos)
    return tid, acks, timeout, topics


def put_uvarint(out: bytearray, v: int) -> None:
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def hand_encode_fetch_v12(topics) -> bytes:
    out = bytearray(struct.pack(">ihi", 0, 0, 0))
    put_uvarint(out, len(topics) + 1)
    for name, parts in topics:
        nb = name.encode()
        put_uvarint(out, len(nb) + 1)
        out += nb
        put_uvarint(out, len(parts) + 1)
        for index, records in parts:
            out += struct.pack(">ihqqq", index, 0, 100, 100, 0)
            out.append(0)  # null aborted transactions
            out += struct.pack(">i", -1)
            put_uvarint(out, len(records) + 1)
            out += records
            out.append(0)
        out.append(0)
    out.append(0)
    return bytes(out)


def timeit(fn, n: int) -> float:
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    R = request_class(ApiKey.PRODUCE)
    frame = encode_request(ApiKey.PRODUCE, 9, 1, dict(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        R.TopicProduceData(name="bench", partition_data=[
            R.TopicProduceData.PartitionProduceData(index=i, records=RECORDS) for i in range(PARTITIONS)])]))
    body = memoryview(frame)[4 + 8 + 2 + 7 + 1:]
    assert hand_decode_produce_v9(body)[3][0][1][0][0] == 0
    kp_produce = timeit(lambda: R.decode(body, version=9), 5000)
    hand_produce = timeit(lambda: hand_decode_produce_v9(body), 5000)

    F = response_class(ApiKey.FETCH)
    PD = F.FetchableTopicResponse.PartitionData
    resp = F(version=12, throttle_time_ms=0, error_code=0, session_id=0, responses=[F.FetchableTopicResponse(
        topic="bench", partitions=[PD(partition_index=i, error_code=0, high_watermark=100, last_stable_offset=100,
                                      log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                                      records=RECORDS) for i in range(PARTITIONS)])])
    kp_fetch = timeit(lambda: resp.encode(version=12), 5000)
    tops = [("bench", [(i, RECORDS) for i in range(PARTITIONS)])]
    hand_fetch = timeit(lambda: hand_encode_fetch_v12(tops), 5000)
    result = {
        "setup": f"Produce v9 request / Fetch v12 response, 1 topic x {PARTITIONS} partitions x {len(RECORDS)} B records",
        "produce_decode_us": {"kafka_python": kp_produce, "hand_written": hand_produce},
        "fetch_encode_us": {"kafka_python": kp_fetch, "hand_written": hand_fetch},
    }
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results" / "codec.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
