"""Bucket of a key, as Kafka producers partition keys: the Java client's default partitioner
(murmur2 of the key bytes, made positive, mod buckets) or librdkafka's (`consistent_random`:
CRC-32 of the key bytes mod buckets). A primary-key table picks one at creation
(`fluvial.bucket.function`), so that its producers' default settings put each key where the
table expects it."""
from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa

_SEED = np.uint32(0x9747B28C)
_M = np.uint32(0x5BD1E995)


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2` as a signed 32-bit int (one key; see `murmur2_array` for many)."""
    arr = murmur2_array(pa.array([data], pa.binary()))
    return int(arr.view(np.int32)[0])


def _key_bytes(keys: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each key's start and length in one byte buffer, and the buffer; None when no keys."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    if n == 0:
        return None
    _, obuf, dbuf = keys.buffers()
    offsets = np.frombuffer(obuf, np.int32, n + 1, keys.offset * 4).astype(np.int64)
    start = offsets[:-1]
    data = np.frombuffer(dbuf, np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
    return start, offsets[1:] - start, data


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """murmur2 of every value of a binary array (uint32), all keys advanced together one
    4-byte word at a time, so the Python loop runs over word positions, not keys."""
    parts = _key_bytes(keys)
    if parts is None:
        return np.zeros(0, np.uint32)
    start, length, data = parts
    data = np.concatenate([data, np.zeros(4, np.uint8)])
    with np.errstate(over="ignore"):
        h = _SEED ^ length.astype(np.uint32)
        words = length // 4
        for w in range(int(words.max())):
            rows = np.flatnonzero(words > w)
            p = start[rows] + 4 * w
            k = (data[p].astype(np.uint32) | (data[p + 1].astype(np.uint32) << 8)
                 | (data[p + 2].astype(np.uint32) << 16) | (data[p + 3].astype(np.uint32) << 24))
            k = k * _M
            k ^= k >> np.uint32(24)
            k = k * _M
            h[rows] = (h[rows] * _M) ^ k
        tail = length % 4
        base = start + words * 4
        for extra, shift in ((3, 16), (2, 8), (1, 0)):
            rows = np.flatnonzero(tail >= extra)
            h[rows] ^= data[base[rows] + extra - 1].astype(np.uint32) << np.uint32(shift)
        rows = np.flatnonzero(tail > 0)
        h[rows] = h[rows] * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return h


def _crc32_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0xEDB88320), table >> np.uint32(1))
    return table.astype(np.uint32)


_CRC32 = _crc32_table()


def crc32_array(keys: pa.Array) -> np.ndarray:
    """CRC-32 (IEEE, as zlib and librdkafka compute it) of every value of a binary array
    (uint32), all keys advanced together one byte at a time."""
    parts = _key_bytes(keys)
    if parts is None:
        return np.zeros(0, np.uint32)
    start, length, data = parts
    crc = np.full(len(start), 0xFFFFFFFF, np.uint32)
    for p in range(int(length.max())):
        rows = np.flatnonzero(length > p)
        c = crc[rows]
        crc[rows] = _CRC32[(c ^ data[start[rows] + p]) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


class BucketFunction:
    """How keys map to buckets: `murmur2` (Java client default) or `crc32` (librdkafka default)."""

    MURMUR2 = "murmur2"
    CRC32 = "crc32"
    # Accepted spellings: the partitioner names of the clients that use each function.
    ALIASES = {"murmur2": MURMUR2, "murmur2_random": MURMUR2, "crc32": CRC32, "consistent_random": CRC32,
               "consistent": CRC32}

    @classmethod
    def normalize(cls, name: str | None) -> str:
        return cls.ALIASES[(name or cls.MURMUR2).strip().lower()]

    @classmethod
    def describe(cls, name: str) -> str:
        if cls.normalize(name) == cls.CRC32:
            return "CRC-32 of the key bytes, librdkafka's default partitioner consistent_random"
        return "murmur2 of the key bytes, the Java client's default partitioner (librdkafka: murmur2_random)"


# Up to this many keys (point lookups) hash one by one: the array form's fixed cost (a few
# dozen NumPy calls) is larger than a handful of keys' worth of plain integer work.
FEW_KEYS = 8


def _murmur2_one(data: bytes) -> int:
    """murmur2 of one key (uint32), the same arithmetic as `murmur2_array` on Python ints."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    n = len(data)
    h = (0x9747B28C ^ n) & mask
    words = n // 4
    for w in range(words):
        k = int.from_bytes(data[4 * w:4 * w + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[4 * words:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h


def buckets_of(keys: pa.Array, buckets: int, function: str = BucketFunction.MURMUR2) -> np.ndarray:
    """The bucket of each key: `toPositive(murmur2(key)) % buckets`, as the Java producer picks,
    or with `crc32`, `crc32(key) % buckets`, as librdkafka's consistent_random picks."""
    crc = BucketFunction.normalize(function) == BucketFunction.CRC32
    if len(keys) <= FEW_KEYS:
        values = keys.to_pylist() if keys.type == pa.binary() else keys.cast(pa.binary()).to_pylist()
        hashes = [zlib.crc32(v) if crc else _murmur2_one(v) & 0x7FFFFFFF for v in values]
        return np.array([h % buckets for h in hashes], np.int32)
    if crc:
        return (crc32_array(keys) % np.uint32(buckets)).astype(np.int32)
    h = murmur2_array(keys) & np.uint32(0x7FFFFFFF)
    return (h % np.uint32(buckets)).astype(np.int32)


def bucket_of(key: bytes, buckets: int, function: str = BucketFunction.MURMUR2) -> int:
    return int(buckets_of(pa.array([key], pa.binary()), buckets, function)[0])
