"""Frames, request/response headers and message bodies of the Kafka codec."""
from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.errors import FluvialError
from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import (ApiKey, RequestHeader, decode_request_body, decode_request_header,
                                       decode_response, encode_api_versions_unsupported, encode_request,
                                       encode_response, request_class, response_class)


def test_request_header_v1_and_v2_round_trip():
    for version in (8, 9):  # Metadata v9 is the first flexible version: header v2
        frame = encode_request(ApiKey.METADATA, version, 42, dict(topics=None, allow_auto_topic_creation=True,
                                                                  include_topic_authorized_operations=False),
                               client_id="me")
        body = memoryview(frame)[4:]
        assert struct.unpack(">i", frame[:4])[0] == len(body)
        h = decode_request_header(body)
        assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, version, 42, "me")
        req = decode_request_body(h, body)
        assert req.topics is None and req.allow_auto_topic_creation


def test_flexible_response_has_tagged_header_but_api_versions_does_not():
    h = RequestHeader(ApiKey.METADATA, 9, 7, "c", 0)
    out = encode_response(h, response_class(ApiKey.METADATA)(version=9, brokers=[], topics=[], cluster_id="x",
                                                             controller_id=1, throttle_time_ms=0))
    assert out[4:8] == struct.pack(">i", 7) and out[8] == 0  # empty tagged fields after the correlation id
    cid, resp = decode_response(ApiKey.METADATA, 9, out[4:])
    assert cid == 7 and resp.cluster_id == "x"
    h = RequestHeader(ApiKey.API_VERSIONS, 3, 8, "c", 0)
    out = encode_response(h, response_class(ApiKey.API_VERSIONS)(version=3, error_code=0, api_keys=[]))
    cid, resp = decode_response(ApiKey.API_VERSIONS, 3, out[4:])
    assert cid == 8 and resp.error_code == 0


def test_kip511_answer_is_v0():
    h = RequestHeader(ApiKey.API_VERSIONS, 77, 3, None, 0)
    out = encode_api_versions_unsupported(h, {ApiKey.API_VERSIONS: (0, 4)})
    cid, resp = decode_response(ApiKey.API_VERSIONS, 0, out[4:])
    assert resp.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 4)]


def test_produce_request_records_are_bytes():
    R = request_class(ApiKey.PRODUCE)
    frame = encode_request(ApiKey.PRODUCE, 9, 1, dict(transactional_id=None, acks=-1, timeout_ms=100, topic_data=[
        R.TopicProduceData(name="t", partition_data=[R.TopicProduceData.PartitionProduceData(index=2, records=b"abc")])]))
    body = memoryview(frame)[4:]
    req = decode_request_body(decode_request_header(body), body)
    assert bytes(req.topic_data[0].partition_data[0].records) == b"abc"


API_VERSIONS_TO_FUZZ = [(ApiKey.PRODUCE, 9), (ApiKey.PRODUCE, 3), (ApiKey.FETCH, 11), (ApiKey.FETCH, 13),
                        (ApiKey.METADATA, 12), (ApiKey.METADATA, 1), (ApiKey.LIST_OFFSETS, 7),
                        (ApiKey.CREATE_TOPICS, 5), (ApiKey.API_VERSIONS, 3)]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(API_VERSIONS_TO_FUZZ), st.binary(max_size=200))
def test_fuzz_request_bodies_raise_only_fluvial_errors(api, junk):
    api_key, version = api
    head = struct.pack(">hhi", api_key, version, 1) + struct.pack(">h", 1) + b"c"
    flexible = request_class(api_key).flexible_version_q(version)
    frame = memoryview(head + (b"\x00" if flexible else b"") + junk)
    try:
        header = decode_request_header(frame)
        decode_request_body(header, frame)
    except FluvialError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_request_headers(junk):
    try:
        decode_request_header(memoryview(junk))
    except FluvialError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(API_VERSIONS_TO_FUZZ), st.data())
def test_fuzz_truncations_of_valid_requests(api, data):
    api_key, version = api
    if api_key != ApiKey.METADATA:
        return
    frame = encode_request(api_key, version, 5, dict(topics=[request_class(api_key).MetadataRequestTopic(name="abc")],
                                                     allow_auto_topic_creation=False,
                                                     include_topic_authorized_operations=False))[4:]
    cut = data.draw(st.integers(0, len(frame) - 1))
    try:
        header = decode_request_header(memoryview(frame[:cut]))
        decode_request_body(header, memoryview(frame[:cut]))
    except FluvialError:
        pass
