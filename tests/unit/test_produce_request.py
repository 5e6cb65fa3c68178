"""The hand-written Produce request decoder reads what kafka-python's decoder reads, v3-11."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.errors import InvalidRequestError
from fluvial.protocol.messages import ApiKey, decode_request_body, decode_request_header, encode_request, request_class
from fluvial.protocol.produce_request import decode_produce_request

R = request_class(ApiKey.PRODUCE)
VERSIONS = range(3, 13)

partitions = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.none() | st.binary(max_size=300)), max_size=3)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=200), partitions), max_size=3)


def frame_of(version: int, transactional_id, acks: int, timeout: int, topics) -> memoryview:
    body = dict(transactional_id=transactional_id, acks=acks, timeout_ms=timeout, topic_data=[
        R.TopicProduceData(name=name, partition_data=[
            R.TopicProduceData.PartitionProduceData(index=i, records=rec) for i, rec in parts])
        for name, parts in topics])
    return memoryview(encode_request(ApiKey.PRODUCE, version, 5, body))[4:]


def as_tuple(request) -> tuple:
    return (request.transactional_id, request.acks, request.timeout_ms,
            [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
             for t in request.topic_data])


@given(version=st.sampled_from(VERSIONS), transactional_id=st.none() | st.text(max_size=50),
       acks=st.integers(-2**15, 2**15 - 1), timeout=st.integers(-2**31, 2**31 - 1), topics=topics)
@settings(max_examples=400, deadline=None)
def test_fields_equal_kafka_python_decoding(version, transactional_id, acks, timeout, topics):
    frame = frame_of(version, transactional_id, acks, timeout, topics)
    header = decode_request_header(frame)
    ours = decode_produce_request(frame[header.header_size:], version)
    assert as_tuple(ours) == as_tuple(decode_request_body(header, frame))
    assert as_tuple(ours) == (transactional_id, acks, timeout, topics)


@given(version=st.sampled_from(VERSIONS), topics=topics.filter(bool), data=st.data())
@settings(max_examples=200, deadline=None)
def test_a_truncated_request_is_refused(version, topics, data):
    frame = frame_of(version, "tx", -1, 1000, topics)
    header = decode_request_header(frame)
    body = frame[header.header_size:]
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(InvalidRequestError):
        decode_produce_request(body[:cut], version)


@given(garbage=st.binary(max_size=200), version=st.sampled_from(VERSIONS))
@settings(max_examples=300, deadline=None)
def test_garbage_gives_a_clear_error_or_a_request(garbage, version):
    try:
        decode_produce_request(memoryview(garbage), version)
    except InvalidRequestError:
        pass


def test_records_are_views_of_the_frame():
    frame = frame_of(9, None, -1, 30_000, [("events", [(0, b"batch-bytes")])])
    header = decode_request_header(frame)
    request = decode_produce_request(frame[header.header_size:], 9)
    records = request.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records.obj is frame.obj
