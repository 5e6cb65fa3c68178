"""`records.check_produced` (one compiled call for the usual produced batch) accepts
exactly the batches the step-by-step checks accept, with the same fields: for random
batches (uncompressed, raw snappy, gzip, snappy-java framed) and random damage to them,
either it declines (None) or `checked_wire_records` gives what parse_batch_header,
verify_crc and to_wire_records give; intact uncompressed and raw-snappy batches are
taken by it."""
from __future__ import annotations

import struct

import cramjam
import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fluvial.broker import kafka_batches
from fluvial.broker.log.batch_meta import ATTR_TRANSACTIONAL
from fluvial.errors import FluvialError
from fluvial.protocol import records
from fluvial.protocol.compression import XERIAL_MAGIC, Compression, compress
from fluvial.protocol.records import HEADER_SIZE, LENGTH_END, RecordColumns, build_batch, check_produced

pytestmark = pytest.mark.skipif(records._native_produced is None, reason="compiled records module not built")


def stepwise(batch: bytes):
    """produce_one's steps before the compiled check: the records and meta, or None."""
    try:
        header = kafka_batches.lone_batch_header(batch)
        return None if header is None else kafka_batches.to_wire_records(memoryview(batch), header)
    except FluvialError:
        return None


def fields(got) -> tuple:
    wire, meta = got
    return (bytes(wire.section), wire.num_rows, wire.base_timestamp, wire.first_timestamp, wire.max_timestamp, meta)


def make(n: int, codec: Compression, producer_id: int, attributes: int, value_size: int, deltas) -> bytearray:
    columns = RecordColumns.from_lists(
        [None if i % 2 else b"k%d" % i for i in range(n)], [bytes([65 + i % 26]) * (value_size + i) for i in range(n)],
        [[("h", b"v")] if i % 3 == 0 else [] for i in range(n)], timestamp_delta=deltas[:n])
    return bytearray(build_batch(base_offset=0, partition_leader_epoch=3, attributes=attributes,
                                 base_timestamp=1_700_000_000_000, max_timestamp=1_700_000_000_000 + max(deltas[:n]),
                                 producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                                 base_sequence=5 if producer_id >= 0 else -1, columns=columns, compression=codec))


def raw_snappy(batch: bytearray) -> bytearray:
    """An uncompressed batch with its records as one raw snappy block (librdkafka, franz-go)."""
    out = batch[:HEADER_SIZE] + bytes(cramjam.snappy.compress_raw(bytes(batch[HEADER_SIZE:])))
    struct.pack_into(">i", out, 8, len(out) - LENGTH_END)
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | Compression.SNAPPY)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return out


def xerial(batch: bytearray) -> bytearray:
    """An uncompressed batch with its records in snappy-java's framing (as kafka-python writes)."""
    block = compress(Compression.SNAPPY, bytes(batch[HEADER_SIZE:]))
    framed = batch[:HEADER_SIZE] + block
    struct.pack_into(">i", framed, 8, len(framed) - LENGTH_END)
    struct.pack_into(">h", framed, 21, struct.unpack_from(">h", framed, 21)[0] | Compression.SNAPPY)
    struct.pack_into(">I", framed, 17, crc32c.crc32c(bytes(framed[21:])))
    return framed


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_accepts_what_the_steps_accept_with_the_same_fields(data):
    n = data.draw(st.integers(1, 5))
    codec = data.draw(st.sampled_from([Compression.NONE, Compression.SNAPPY, Compression.GZIP]))
    attributes = data.draw(st.sampled_from([0, 0, 0, ATTR_TRANSACTIONAL, 0x20, 0x08]))
    deltas = data.draw(st.lists(st.integers(0, 10_000), min_size=5, max_size=5))
    snappy = codec is Compression.SNAPPY
    batch = make(n, Compression.NONE if snappy else codec, data.draw(st.sampled_from([-1, 7])), attributes,
                 data.draw(st.integers(0, 300)), deltas)
    if snappy:
        batch = xerial(batch) if data.draw(st.booleans()) else raw_snappy(batch)
    intact = bytes(batch)
    for _ in range(data.draw(st.integers(0, 3))):
        batch[data.draw(st.integers(0, len(batch) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        batch = batch[:data.draw(st.integers(0, len(batch)))] if data.draw(st.booleans()) else batch + b"\0"
    expected = stepwise(bytes(batch))
    checked = check_produced(memoryview(batch))
    if checked is not None:
        assert expected is not None
        assert fields(kafka_batches.checked_wire_records(memoryview(batch), checked)) == fields(expected)
    elif bytes(batch) == intact and not attributes & 0x30 and (
            codec is Compression.NONE or snappy and intact[HEADER_SIZE:HEADER_SIZE + 8] != XERIAL_MAGIC):
        pytest.fail("an intact uncompressed or raw-snappy batch was not taken by the compiled check")


def test_crc_over_every_length_and_alignment():
    """The CRC-32C (the CPU's instruction or the table) over sections of every small length."""
    for size in range(0, 70):
        batch = make(1, Compression.NONE, -1, 0, size, [0] * 5)
        assert check_produced(memoryview(batch)) is not None
        for at in (21, len(batch) - 1, 21 + size // 2):
            damaged = bytearray(batch)
            damaged[at] ^= 0x01
            assert check_produced(memoryview(damaged)) is None
