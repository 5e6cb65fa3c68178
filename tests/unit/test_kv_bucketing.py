"""murmur2 bucketing: the same partitions as Kafka's Java default partitioner."""
from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from fluvial.kv.bucketing import bucket_of, buckets_of, murmur2, murmur2_array


def test_values_from_kafkas_utils_test():
    # Apache Kafka's UtilsTest#testMurmur2 expectations.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=50), st.integers(1, 64))
def test_vectorized_matches_a_reference_per_key(keys, buckets):
    hashes = murmur2_array(pa.array(keys, pa.binary()))
    expected = [kafka_python_murmur2(k) & 0xFFFFFFFF for k in keys]
    assert hashes.tolist() == expected
    assert buckets_of(pa.array(keys, pa.binary()), buckets).tolist() == [
        (h & 0x7FFFFFFF) % buckets for h in expected]


def test_sliced_arrays_and_single_keys():
    arr = pa.array([b"x", b"21", b"foobar"], pa.binary()).slice(1)
    assert murmur2_array(arr).view("int32").tolist() == [-973932308, -790332482]
    assert bucket_of(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7


def test_crc32_bucketing_matches_librdkafka_consistent_random():
    """librdkafka's default partitioner: zlib's CRC-32 of the key bytes mod the partition count."""
    import os
    import zlib

    import pyarrow as pa

    from fluvial.kv.bucketing import BucketFunction, bucket_of, buckets_of, crc32_array

    keys = [os.urandom(i % 53) for i in range(3000)] + [b"", b"key-0001"]
    assert crc32_array(pa.array(keys, pa.binary())).tolist() == [zlib.crc32(k) for k in keys]
    assert buckets_of(pa.array(keys, pa.binary()), 7, "crc32").tolist() == [zlib.crc32(k) % 7 for k in keys]
    assert bucket_of(b"key-0001", 5, "consistent_random") == zlib.crc32(b"key-0001") % 5
    assert BucketFunction.normalize("murmur2_random") == "murmur2"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8), st.integers(1, 64),
       st.sampled_from(["murmur2", "crc32"]))
def test_few_keys_hash_one_by_one_to_the_same_buckets(keys, buckets, function):
    """Point lookups hash their few keys one by one: the same buckets as the array form,
    which a batch of more keys takes (compared on the keys repeated past the threshold)."""
    from fluvial.kv.bucketing import FEW_KEYS
    few = buckets_of(pa.array(keys, pa.binary()), buckets, function).tolist()
    many = buckets_of(pa.array(keys * (FEW_KEYS + 1), pa.binary()), buckets, function).tolist()
    assert few == many[:len(keys)]
    assert [bucket_of(k, buckets, function) for k in keys] == few
