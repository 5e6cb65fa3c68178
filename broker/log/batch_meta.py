"""Batch-level Kafka metadata stored with every Arrow batch of a log tablet."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from fluvial.broker.gc_untracked import untracked, untracked_tuple

# Kafka record batch v2 attribute bits.
ATTR_COMPRESSION_MASK = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40

_ENCODING_VERSION = "1"
_FIELDS = (
    "base_offset",
    "last_offset_delta",
    "record_count",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "attributes",
    "partition_leader_epoch",
    "schema_id",
)
# Appended fields (encoding version 1 allows more fields after the known ones): written
# only when they differ from their defaults, so batches without them keep their bytes.
_OPTIONAL_FIELDS = ("producer_record_count", "delete_horizon_ms")
_ENCODED = (_ENCODING_VERSION + ";%d" * len(_FIELDS)).encode("ascii")


_set = object.__setattr__

try:
    from fluvial.broker.log import _meta_text as _native
except ImportError:  # built without a compiler: encode_parts formats in Python
    _native = None


@untracked  # integers only: never in a cycle, and the log keeps one per stored batch
@dataclass(frozen=True, slots=True, init=False)
class BatchMeta:
    """What Kafka keeps in a record batch header, beside the rows themselves.

    Its ``__init__`` is written out (the fields, in order, with their defaults): every
    produced batch makes two or three, and the generated one of a frozen dataclass looks
    ``object.__setattr__`` up for every field (1.3-1.4 against 1.1-1.2 us, timeit)."""

    base_offset: int
    last_offset_delta: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    attributes: int = 0
    partition_leader_epoch: int = 0
    schema_id: int = -1
    # How many records (sequence numbers) the producer's batch held, when the stored rows
    # differ from them: a primary-key table stores the batch's changelog (-U/+U for an
    # update, nothing for a no-op), not the records sent. -1: the same as record_count.
    producer_record_count: int = -1
    # Log compaction: set when the cleaner first kept this batch's tombstones; once the wall
    # clock passes it (delete.retention.ms later) a later cleaning removes them. -1: none.
    delete_horizon_ms: int = -1

    def __init__(self, base_offset: int, last_offset_delta: int, record_count: int, base_timestamp: int,
                 max_timestamp: int, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
                 attributes: int = 0, partition_leader_epoch: int = 0, schema_id: int = -1,
                 producer_record_count: int = -1, delete_horizon_ms: int = -1) -> None:
        _set(self, "base_offset", base_offset)
        _set(self, "last_offset_delta", last_offset_delta)
        _set(self, "record_count", record_count)
        _set(self, "base_timestamp", base_timestamp)
        _set(self, "max_timestamp", max_timestamp)
        _set(self, "producer_id", producer_id)
        _set(self, "producer_epoch", producer_epoch)
        _set(self, "base_sequence", base_sequence)
        _set(self, "attributes", attributes)
        _set(self, "partition_leader_epoch", partition_leader_epoch)
        _set(self, "schema_id", schema_id)
        _set(self, "producer_record_count", producer_record_count)
        _set(self, "delete_horizon_ms", delete_horizon_ms)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_sequence_delta(self) -> int:
        """The producer's last sequence minus its base sequence (sequences wrap at 2**31)."""
        n = self.record_count if self.producer_record_count < 0 else self.producer_record_count
        return n - 1

    @property
    def compression_codec(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & ATTR_LOG_APPEND_TIME)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    def encode(self) -> bytes:
        """ASCII form kept in the IPC message's custom metadata (readable by any Arrow tool):
        the encoding version, then the fields of ``_FIELDS`` and the optional ones that are
        not -1, separated by ``;``. One format string: every append encodes one."""
        text = _ENCODED % (self.base_offset, self.last_offset_delta, self.record_count, self.base_timestamp,
                           self.max_timestamp, self.producer_id, self.producer_epoch, self.base_sequence,
                           self.attributes, self.partition_leader_epoch, self.schema_id)
        if self.producer_record_count != -1 or self.delete_horizon_ms != -1:
            text += b";%d" % self.producer_record_count
        if self.delete_horizon_ms != -1:
            text += b";%d" % self.delete_horizon_ms
        return text

    @classmethod
    def decode(cls, data: bytes) -> BatchMeta:
        parts = data.split(b";")
        if parts[0] != _ENCODING_VERSION.encode() or len(parts) < len(_FIELDS) + 1:
            raise ValueError(f"unknown batch metadata encoding {bytes(data[:16])!r}")
        # Later versions may append fields; the known prefix keeps its meaning.
        return cls(*map(int, parts[1 : len(_FIELDS) + len(_OPTIONAL_FIELDS) + 1]))


if _native is not None:
    _native.use_class(BatchMeta)


def encode_parts(parts: "list[BatchMeta] | tuple[BatchMeta, ...]") -> bytes:
    """The Kafka batches of a coalesced message, one encoded BatchMeta a line. Compiled
    (`_meta_text.c`) when built: formatting tens of metas of eleven integers each was the
    largest per-request cost of a flush under many small producers."""
    if _native is not None:
        try:
            return _native.encode_parts(parts)
        except (OverflowError, TypeError):
            pass  # a field beyond int64 or not an int (never from Kafka): Python formats it
    return encode_parts_py(parts)


def encode_parts_py(parts: "list[BatchMeta] | tuple[BatchMeta, ...]") -> bytes:
    return b"\n".join([m.encode() for m in parts])


def decode_parts(data: bytes) -> tuple[BatchMeta, ...]:
    return untracked_tuple(tuple([BatchMeta.decode(line) for line in data.split(b"\n")]))


def envelope(parts: "list[BatchMeta] | tuple[BatchMeta, ...]") -> BatchMeta:
    """The BatchMeta of a message holding several Kafka batches: their offsets, timestamps
    and leader epoch, and no producer or attributes of its own (each part keeps its own)."""
    first, last = parts[0], parts[-1]
    # List comprehensions rather than generators: a flush under many small producers builds
    # one envelope of tens of parts.
    return BatchMeta(first.base_offset, last.base_offset + last.last_offset_delta - first.base_offset,
                     sum([m.record_count for m in parts]), first.base_timestamp,
                     max([m.max_timestamp for m in parts]), partition_leader_epoch=last.partition_leader_epoch,
                     schema_id=first.schema_id)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One Arrow batch as stored in the log, with its Kafka batch metadata."""

    meta: BatchMeta
    batch: pa.RecordBatch
