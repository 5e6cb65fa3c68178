"""The hand-written Produce response encoder writes exactly kafka-python's bytes, v3-11."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.protocol.messages import ApiKey, RequestHeader, decode_response, encode_response, response_class
from fluvial.protocol.produce_response import ProducedPartition, encode_produce_response

R = response_class(ApiKey.PRODUCE)
PR = R.TopicProduceResponse.PartitionProduceResponse
VERSIONS = range(3, 13)

partition = st.builds(
    ProducedPartition,
    index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([0, 1, 2, 10, 56, 87]),
    base_offset=st.integers(-1, 2**63 - 1),
    log_append_time_ms=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**63 - 1),
    record_errors=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.none() | st.text(max_size=200)), max_size=3),
    # Long enough for multi-byte compact lengths too.
    error_message=st.none() | st.text(max_size=40) | st.just("e" * 300),
)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=249), st.lists(partition, max_size=4)), max_size=4)


def reference(header: RequestHeader, throttle: int, topics) -> bytes:
    body = R(version=header.api_version, throttle_time_ms=throttle, responses=[R.TopicProduceResponse(
        name=name, partition_responses=[PR(
            index=p.index, error_code=p.error_code, base_offset=p.base_offset,
            log_append_time_ms=p.log_append_time_ms, log_start_offset=p.log_start_offset,
            record_errors=[PR.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                           for i, m in p.record_errors],
            error_message=p.error_message) for p in parts]) for name, parts in topics])
    return encode_response(header, body)


@given(version=st.sampled_from(VERSIONS), correlation=st.integers(-2**31, 2**31 - 1),
       throttle=st.integers(0, 2**31 - 1), topics=topics)
@settings(max_examples=400, deadline=None)
def test_bytes_equal_kafka_python_encoding(version, correlation, throttle, topics):
    header = RequestHeader(ApiKey.PRODUCE, version, correlation, "c", 0)
    assert encode_produce_response(header, topics, throttle) == reference(header, throttle, topics)


def test_every_version_round_trips_through_the_decoder():
    for version in VERSIONS:
        header = RequestHeader(ApiKey.PRODUCE, version, 7, "c", 0)
        frame = encode_produce_response(header, [("events", [
            ProducedPartition(0, 0, 41, -1, 3), ProducedPartition(1, 87, record_errors=[(2, "bad")],
                                                                  error_message="invalid record")])])
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        cid, decoded = decode_response(ApiKey.PRODUCE, version, frame[4:])
        assert cid == 7
        (topic,) = decoded.responses
        ok, bad = topic.partition_responses
        assert (topic.name, ok.base_offset, bad.error_code) == ("events", 41, 87)
        if version >= 5:
            assert ok.log_start_offset == 3
        if version >= 8:
            assert bad.error_message == "invalid record"
            assert [(e.batch_index, e.batch_index_error_message) for e in bad.record_errors] == [(2, "bad")]


@pytest.mark.parametrize("version", [2, 13])
def test_versions_outside_the_range_are_refused(version):
    with pytest.raises(ValueError):
        encode_produce_response(RequestHeader(ApiKey.PRODUCE, version, 1, "c", 0), [])


one_partition = st.builds(
    ProducedPartition, index=st.integers(0, 2**31 - 1), error_code=st.sampled_from([0, 1, 6, 10, 56, 87]),
    base_offset=st.integers(-1, 2**63 - 1), log_append_time_ms=st.integers(-1, 2**62),
    log_start_offset=st.integers(-1, 2**63 - 1))


@given(version=st.sampled_from(VERSIONS), correlation=st.integers(-2**31, 2**31 - 1),
       name=st.text(min_size=1, max_size=249) | st.just("t" * 130), p=one_partition)
@settings(max_examples=400, deadline=None)
def test_the_one_partition_answer_built_from_its_cached_parts_is_kafka_pythons(version, correlation, name, p):
    """The common small producer's answer takes the cached (version, topic) layout: same bytes,
    also when the same topic is answered again at another version or correlation id."""
    header = RequestHeader(ApiKey.PRODUCE, version, correlation, "c", 0)
    topics = [(name, [p])]
    assert encode_produce_response(header, topics) == reference(header, 0, topics)
    again = RequestHeader(ApiKey.PRODUCE, version, correlation ^ 1, "c", 0)
    assert encode_produce_response(again, topics) == reference(again, 0, topics)
