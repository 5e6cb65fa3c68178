"""The hand-written Fetch response encoder writes exactly kafka-python's bytes, v4-17."""
from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.protocol.fetch_response import FetchedPartition, encode_fetch_response
from fluvial.protocol.messages import ApiKey, RequestHeader, decode_response, encode_response, response_class

R = response_class(ApiKey.FETCH)
VERSIONS = range(4, 18)

partition = st.builds(
    FetchedPartition,
    partition_index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 1, 3, 6, 100]),
    high_watermark=st.integers(-1, 2**63 - 1),
    last_stable_offset=st.integers(-1, 2**63 - 1),
    log_start_offset=st.integers(-1, 2**63 - 1),
    # Batches of any size, including long enough for multi-byte varint lengths.
    records=st.lists(st.binary(max_size=300), max_size=3) | st.just([b"r" * 20_000]),
)
topics_by_name = st.lists(st.tuples(st.text(min_size=1, max_size=140), st.lists(partition, max_size=4)),
                          max_size=4)
topics_by_id = st.lists(st.tuples(st.uuids(), st.lists(partition, max_size=4)), max_size=4)


def reference(header: RequestHeader, throttle: int, error: int, session: int, topics) -> bytes:
    by_id = header.api_version >= 13
    body = R(version=header.api_version, throttle_time_ms=throttle, error_code=error, session_id=session,
             responses=[R.FetchableTopicResponse(
                 topic=None if by_id else key, topic_id=key if by_id else None,
                 partitions=[R.FetchableTopicResponse.PartitionData(
                     partition_index=p.partition_index, error_code=p.error_code, high_watermark=p.high_watermark,
                     last_stable_offset=p.last_stable_offset, log_start_offset=p.log_start_offset,
                     aborted_transactions=None, preferred_read_replica=-1, records=b"".join(p.records))
                     for p in parts]) for key, parts in topics])
    return encode_response(header, body)


@given(version=st.sampled_from(VERSIONS), correlation=st.integers(-2**31, 2**31 - 1),
       throttle=st.integers(0, 2**31 - 1), error=st.sampled_from([0, 70]), session=st.integers(0, 2**31 - 1),
       named=topics_by_name, identified=topics_by_id)
@settings(max_examples=400, deadline=None)
def test_bytes_equal_kafka_python_encoding(version, correlation, throttle, error, session, named, identified):
    header = RequestHeader(ApiKey.FETCH, version, correlation, "c", 0)
    topics = identified if version >= 13 else named
    ours = encode_fetch_response(header, throttle_time_ms=throttle, error_code=error, session_id=session,
                                 topics=topics).to_bytes()
    assert ours == reference(header, throttle, error, session, topics)


def test_every_version_round_trips_through_the_decoder():
    topic_id = uuid.uuid4()
    for version in VERSIONS:
        header = RequestHeader(ApiKey.FETCH, version, 42, "c", 0)
        key = topic_id if version >= 13 else "events"
        parts = [FetchedPartition(0, 0, 10, 10, 2, [b"a" * 70, b"b" * 90]), FetchedPartition(1, 6)]
        frame = encode_fetch_response(header, throttle_time_ms=0, error_code=0, session_id=0,
                                      topics=[(key, parts)]).to_bytes()
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        cid, decoded = decode_response(ApiKey.FETCH, version, frame[4:])
        assert cid == 42
        (topic,) = decoded.responses
        assert (topic.topic_id if version >= 13 else topic.topic) == key
        first, second = topic.partitions
        assert bytes(first.records) == b"a" * 70 + b"b" * 90
        assert (first.high_watermark, first.log_start_offset if version >= 5 else 2) == (10, 2)
        assert second.error_code == 6 and not second.records
