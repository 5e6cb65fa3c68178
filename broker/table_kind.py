"""One interface for the kinds of table the broker serves: what the handlers call.

A log table stores what producers send, batch for batch, in its log tablets; a
primary-key table merges each write into its KV tablet and stores the resulting changelog
in the log tablets; the `<table>.changelog` view reads those changelogs and takes no
writes. Kafka produce and fetch, DeleteRecords, the transaction coordinator and the
table API do the same thing for every kind (decode, append, read, describe) and call the
table's `kind` for it, never asking which kind a table is: the differences live beside the
storage they concern (`broker/log_table.py` for log tables, `kv/pk_tables.py` for the
primary-key table and its changelog view), and a new kind is a new implementation, not a
new branch in every handler.

`Table.kind` is `LOG_TABLE` unless the primary-key service attached another when the
table was opened. The operations only a primary-key table has (lookups, upserts, KV
snapshots, full reads) are part of the interface too: other kinds refuse them with the
same error a table without a primary key always got.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fluvial.errors import InvalidRequestError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from fluvial.broker.log import BatchMeta
    from fluvial.protocol.records import BatchHeader

# What a table is, as table descriptions (Flight catalog, console) name it.
LOG = "log"
PRIMARY_KEY = "primary_key"
# The name of a primary-key table's read-only changelog view: `<table>.changelog`.
CHANGELOG_SUFFIX = ".changelog"


class TableKind:
    """The operations the handlers call on a table (its `kind`). Methods take the table
    or bucket they act on: one kind object serves every table of its kind."""

    name = LOG

    # -- Kafka writes ---------------------------------------------------------------------
    def check_producible(self, table) -> None:
        """Raise when Kafka producers (or table API appends) may not write to `table`."""

    def check_records_deletable(self, table) -> None:
        """Raise when DeleteRecords may not move the table's log start."""

    def decode_produced(self, bucket, wire: memoryview, header: "BatchHeader", *,
                        log_append_time_ms: int | None, coalesced: bool = False) -> tuple[object, "BatchMeta"]:
        """A produced v2 batch as (what `append_produced` writes, its meta); blocking CPU
        work (the handler runs it off the loop when large). `coalesced`: the append will
        be coalesced with others of its flush window (acks=all under flush policy `ack`),
        so the kind may leave work for then. Raises InvalidRecordError."""
        raise NotImplementedError

    async def hold_transactional(self, broker, bucket, meta: "BatchMeta", wire: bytes) -> bool:
        """A transactional batch admitted to its transaction: True when the kind holds it
        until the transaction ends (answered without an offset), False to append it now."""
        raise NotImplementedError

    async def append_produced(self, broker, bucket, write, meta: "BatchMeta", *, wire: bytearray | None,
                              acks: int, on_append: Callable[["BatchMeta"], None] | None) -> "BatchMeta":
        """Append a decoded batch; returns what was written (record_count 0: nothing
        changed, so the log holds no trace of it). `on_append(written)` runs right at the
        append, before anything else on the loop (idempotent producers' state). `wire`: the
        producer's batch when its bytes stand for what is stored (no LogAppendTime)."""
        raise NotImplementedError

    def append_in_thread(self, bucket, write, meta: "BatchMeta") -> "BatchMeta | None":
        """Append a decoded batch of a producer without producer id (nothing to check
        against producer state) from the executor thread that decoded it, or None when the
        kind appends only through `append_produced` on the loop. Blocking. The handler then
        calls `appended_in_thread` on the loop."""
        return None

    def appends_in_thread(self, table) -> bool:
        """Whether `append_in_thread` appends this table's batches (the produce handler then
        pipelines a producer's large requests, see broker/handlers/produce.py)."""
        return False

    def appended_in_thread(self, broker, bucket, written: "BatchMeta", *, wire: bytearray | None) -> None:
        """On the loop, after `append_in_thread` wrote `written`: what `append_produced`
        does after its append (readers woken or the flush requested, the wire cache)."""
        raise NotImplementedError

    async def end_transaction(self, broker, bucket, producer_id: int, commit: bool) -> bool:
        """The transaction of `producer_id` ends in `bucket`: True when the kind finished it
        itself (held writes applied or dropped), False when a control marker is written."""
        return False

    # -- Kafka reads ----------------------------------------------------------------------
    def read_kafka(self, broker, bucket, offset: int, max_bytes: int, min_one: bool = True) -> tuple[list[bytes], int]:
        """Kafka batches from `offset`, at most `max_bytes` (Kafka's rules), and their size.
        Blocking when the offsets are remote (the fetch handler runs it off the loop then)."""
        raise NotImplementedError

    def cached_tail(self, broker, bucket, offset: int, end: int, limit: int) -> tuple[list[bytes], int] | None:
        """A tailing consumer's batches straight from the wire cache, or None to read them."""
        return None

    def caches_reencoded(self, table) -> bool:
        """Fetches re-encode this table's values into the wire cache (worth reading ahead)."""
        return False

    def prepares_reads(self, table) -> bool:
        """Large fetches of this table's segments are worth reading ahead into a held read
        (`PreparedReads`): its batches below the high watermark never change."""
        return False

    # -- the table API ------------------------------------------------------------------------
    def check_appendable(self, table) -> None:
        """Raise when a table API append (plain rows, no merge) may not go to `table`."""
        self.check_producible(table)

    def describe(self, table) -> dict:
        """The kind's part of a table description: kind, primary key, KV figures."""
        return {"kind": self.name, "primary_key": None, "kv_stats": None}

    def _no_primary_key(self, table):
        raise InvalidRequestError(f"table {table.name!r} has no primary key")

    async def write_rows(self, table, rows: "pa.RecordBatch | pa.Table", *, deletes: "np.ndarray | None" = None,
                         partial_columns: list[str] | None = None) -> list[tuple[int, "BatchMeta"]]:
        """Upserts and deletes by primary key, durable when this returns: (bucket, meta) pairs."""
        self._no_primary_key(table)

    def check_primary_key(self, table) -> None:
        """Raise unless `table` has a primary key (takes upserts, deletes and lookups)."""
        self._no_primary_key(table)

    def lookup(self, table, keys, *, wait_durable: Callable[[object, dict[int, int]], None]) -> "pa.Table":
        """The current rows of primary keys (blocking: off the loop)."""
        self._no_primary_key(table)

    def lookup_batch(self, table, keys, *, wait_durable: Callable[[object, dict[int, int]], None]) -> "pa.RecordBatch":
        """`lookup` as one record batch (a lookup session's answer)."""
        self._no_primary_key(table)

    def prefix_lookup(self, table, prefixes, *, wait_durable: Callable[[object, dict[int, int]], None]) -> "pa.Table":
        """The current rows whose bucket key equals one of `prefixes` (blocking)."""
        self._no_primary_key(table)

    async def await_durable(self, table, fence: dict[int, int]) -> None:
        """On the loop: until each bucket of `fence` is durable up to its offset."""
        self._no_primary_key(table)

    async def kv_snapshot(self, table) -> list:
        """Take a KV snapshot of every bucket now."""
        self._no_primary_key(table)

    def kv_snapshots(self, table) -> list[list]:
        """The KV snapshots kept per bucket, oldest first."""
        self._no_primary_key(table)

    def remote_kv_snapshot(self, bucket) -> dict | None:
        """Where the bucket's newest KV snapshot is in the object store."""
        self._no_primary_key(bucket.table)

    async def full_read(self, bucket) -> tuple["pa.Table", int]:
        """The bucket's current rows and the changelog offset they cover."""
        self._no_primary_key(bucket.table)
