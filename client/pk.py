"""Primary-key operations of the native client: upserts, deletes, lookups, KV snapshots, full reads."""
from __future__ import annotations

import base64
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from fluvial.client.errors import from_flight

LOOKUP = "lookup"
PREFIX_LOOKUP = "prefix-lookup"
KV_SNAPSHOT = "kv-snapshot"
KV_SNAPSHOTS = "kv-snapshots"
FULL_READ = "full-read"
REMOTE_SNAPSHOT = "kv-remote-snapshot"
LOOKUP_SESSION = "lookup-session"


def table_configs(primary_key=None, bucket_key=None, merge_engine=None, version_column=None, upsert_key=None,
                  retract_state_ttl_ms=None, aggregates=None, bucket_function=None) -> dict[str, str]:
    """The table configs of a primary-key table's options (empty for a log table)."""
    out = {}
    if upsert_key:
        out["fluvial.upsert.key"] = ",".join(upsert_key)
    if retract_state_ttl_ms is not None:
        out["fluvial.retract.state.ttl.ms"] = str(int(retract_state_ttl_ms))
    for column, function in (aggregates or {}).items():
        out[f"fluvial.agg.{column}"] = function
    if primary_key:
        out["fluvial.primary.key"] = ",".join(primary_key)
    if bucket_key:
        out["fluvial.bucket.key"] = ",".join(bucket_key)
    if bucket_function:
        out["fluvial.bucket.function"] = bucket_function
    if merge_engine:
        out["fluvial.merge.engine"] = merge_engine
    if version_column:
        out["fluvial.version.column"] = version_column
    return out


def as_arrow(data: Any) -> pa.Table:
    """Rows given as an Arrow table/batch, a list of dicts or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, list):
        return pa.Table.from_pylist(data)
    if isinstance(data, dict):
        return pa.table(data)
    return pa.Table.from_pandas(data, preserve_index=False)


def _ipc(table: pa.Table) -> str:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")


def _call(client, kind: str, body: dict) -> bytes:
    try:
        results = list(client._flight.do_action(flight.Action(kind, json.dumps(body).encode()), client._options()))
    except flight.FlightError as exc:
        raise from_flight(exc) from None
    return results[0].body.to_pybytes() if results else b""


def write(table, data: Any, op: str, columns: list[str] | None = None) -> list[tuple[int, int, int]]:
    """Stream rows as upserts or deletes; returns (bucket, base_offset, changelog rows) per write."""
    rows = as_arrow(data)
    if rows.num_rows == 0:
        return []
    command = json.dumps({"table": table.name, "op": op, "columns": list(columns) if columns else None}).encode()
    try:
        writer, acks = table.client._flight.do_put(flight.FlightDescriptor.for_command(command), rows.schema,
                                                   table.client._options())
        done: list[tuple[int, int, int]] = []
        try:
            for batch in rows.to_batches(max_chunksize=65536):
                writer.write_batch(batch)
            writer.done_writing()
            while True:
                ack = acks.read()
                if ack is None:
                    break
                done += [tuple(w) for w in json.loads(ack.to_pybytes())["written"]]
        finally:
            writer.close()
    except flight.FlightError as exc:
        raise from_flight(exc) from None
    return done


class LookupSession:
    """One table's lookups over one open DoExchange: each lookup writes its keys as one
    record batch and reads the rows found as one. Used by one thread at a time."""

    def __init__(self, client, table: str, key_schema: pa.Schema, header):
        command = json.dumps({"table": table, "op": LOOKUP_SESSION}).encode()
        self.key_schema = key_schema
        self.header = header  # the bearer token it was opened with: a renewed token opens a new one
        self.used = False
        self.last_used = time.monotonic()
        self.lock = threading.Lock()
        self._writer, self._reader = client._flight.do_exchange(flight.FlightDescriptor.for_command(command),
                                                                client._options())
        self._writer.begin(key_schema)

    def lookup(self, keys: pa.RecordBatch) -> pa.Table | None:
        """The rows found, or None when the broker ended the session (the table changed)."""
        self.send(keys)
        return self.receive()

    def send(self, keys: pa.RecordBatch) -> None:
        """One lookup's keys; its answer is the next `receive` after those of earlier sends."""
        self._writer.write_batch(keys)

    def receive(self) -> pa.Table | None:
        """The rows found for the oldest lookup sent and not yet answered, or None when the
        broker ended the session (the table changed)."""
        try:
            chunk = self._reader.read_chunk()
        except StopIteration:
            return None
        self.used = True
        self.last_used = time.monotonic()
        return pa.Table.from_batches([chunk.data])

    def close(self) -> None:
        for step in (self._writer.done_writing, self._writer.close):
            try:
                step()
            except (flight.FlightError, OSError, pa.ArrowException):
                pass  # the stream is already gone


# A session unused this long is closed: an open session holds a broker thread, and a
# broker stopping waits for its open calls, so idle clients must not keep it waiting.
SESSION_IDLE_S = 1.0


class LookupSessions:
    """The client's open lookup sessions, one per table (and key schema); a daemon thread
    closes those idle for `SESSION_IDLE_S`."""

    def __init__(self, client):
        self.client = client
        self._open: dict[str, LookupSession] = {}
        self._lock = threading.Lock()
        self.closed = False
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def _start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = threading.Thread(target=self._reap, name="fluvial-lookup-sessions", daemon=True)
            self._reaper.start()

    def _reap(self) -> None:
        while not self._wake.wait(SESSION_IDLE_S / 4):
            now = time.monotonic()
            idle = []
            with self._lock:
                for table, session in list(self._open.items()):
                    if now - session.last_used >= SESSION_IDLE_S and session.lock.acquire(blocking=False):
                        del self._open[table]
                        idle.append(session)
            for session in idle:
                session.close()

    def _header(self):
        session = self.client._session
        return session.header() if session is not None else None

    def acquire(self, table: str, key_schema: pa.Schema) -> LookupSession | None:
        """The table's session, locked for the caller (opened when there is none or it no
        longer fits); None when another thread is using it."""
        header = self._header()
        with self._lock:
            if self.closed:
                raise ValueError("the client is closed")
            session = self._open.get(table)
            if session is not None:
                if not session.lock.acquire(blocking=False):
                    return None
                if session.key_schema.equals(key_schema) and session.header == header:
                    return session
                del self._open[table]
                session.lock.release()
                session.close()
            session = LookupSession(self.client, table, key_schema, header)
            session.lock.acquire()
            self._open[table] = session
            self._start_reaper()
            return session

    def drop(self, table: str, session: LookupSession) -> None:
        with self._lock:
            if self._open.get(table) is session:
                del self._open[table]
        session.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            sessions, self._open = list(self._open.values()), {}
        self._wake.set()
        for session in sessions:
            session.close()


def _one_batch(keys: pa.Table) -> pa.RecordBatch:
    batches = keys.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in keys.schema], schema=keys.schema)
    return keys.combine_chunks().to_batches()[0]


# Errors of a stream that broke under a reused session (broker restarted, connection
# reset): the lookup is retried once on a new session. Errors the broker gives for the
# request itself (FlightServerError, refusals) are the caller's.
_STREAM_BROKEN = (flight.FlightUnavailableError, flight.FlightInternalError, flight.FlightCancelledError,
                  flight.FlightTimedOutError, OSError)


def lookup(table, keys: Any) -> pa.Table:
    """The rows of `keys` found, over the client's lookup session of the table (one
    message each way per lookup); over a lookup action when another thread is using it."""
    keys = as_arrow(keys)
    batch = _one_batch(keys)
    sessions: LookupSessions = table.client._lookups
    for _ in range(2):
        try:
            session = sessions.acquire(table.name, batch.schema)
        except flight.FlightError as exc:
            raise from_flight(exc) from None
        if session is None:
            break
        reused = session.used
        try:
            rows = session.lookup(batch)
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            session.lock.release()
            sessions.drop(table.name, session)
            if reused and isinstance(exc, _STREAM_BROKEN):
                continue
            if isinstance(exc, flight.FlightError):
                raise from_flight(exc) from None
            raise
        session.lock.release()
        if rows is not None:
            return rows
        sessions.drop(table.name, session)  # ended by the broker: the table's columns changed
    return pa.ipc.open_stream(_call(table.client, LOOKUP, {"table": table.name, "keys": _ipc(keys)})).read_all()


# Bytes of keys sent ahead of their answers by `lookup_batches`. The stream's flow-control
# window (HTTP/2, 64 KiB at first) must hold every lookup not yet read by the broker:
# otherwise the broker, blocked writing an answer the client has not read yet, and the
# client, blocked writing keys the broker has not read yet, would wait for each other.
PIPELINE_BYTES = 32 << 10


def lookup_batches(table, batches: Iterable[Any], in_flight: int = 2) -> Iterator[pa.Table]:
    """The rows found for each batch of keys, in order, with up to `in_flight` batches sent
    ahead of their answers over the client's lookup session (while their keys total at
    most `PIPELINE_BYTES`; a larger batch goes alone): the broker works on one batch while
    the next is on its way and the client reads the answer before. Batches of another key
    schema, a session the broker ended (the table changed), a broken stream, or a session
    busy with another thread: the batches not yet answered are looked up one at a time by
    `lookup`. Errors the broker gives for a batch (bad keys) are raised; abandoning the
    iterator closes its session (answers may still be on their way)."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be at least 1, not {in_flight}")
    sessions: LookupSessions = table.client._lookups
    session: LookupSession | None = None
    sent: deque[pa.RecordBatch] = deque()  # written, answer not read yet
    sent_bytes = 0

    def close(drop: bool) -> None:
        nonlocal session
        if session is not None:
            session.lock.release()
            if drop:
                sessions.drop(table.name, session)
            session = None

    def answer() -> pa.Table | None:
        """The oldest sent batch's rows; None when the session can no longer answer."""
        nonlocal sent_bytes
        try:
            rows = session.receive()
        except (flight.FlightError, OSError, pa.ArrowException) as exc:
            if isinstance(exc, _STREAM_BROKEN):
                return None
            close(True)
            sent.clear()
            if isinstance(exc, flight.FlightError):
                raise from_flight(exc) from None
            raise
        if rows is not None:
            sent_bytes -= sent.popleft().nbytes
        return rows

    def fallback() -> Iterator[pa.Table]:
        """The unanswered batches one at a time, on a new session (`lookup` opens one)."""
        nonlocal sent_bytes
        close(True)
        while sent:
            yield lookup(table, sent.popleft())
        sent_bytes = 0

    def drain(more: Callable[[], bool] = lambda: True) -> Iterator[pa.Table]:
        """Answers of the sent batches, oldest first, while `more()`; the rest one at a
        time once the session can no longer answer."""
        while sent and more():
            rows = answer()
            if rows is None:
                yield from fallback()
                return
            yield rows

    try:
        for keys in batches:
            batch = _one_batch(as_arrow(keys))
            if session is not None and not session.key_schema.equals(batch.schema):
                yield from drain()
                close(False)
            if session is None:
                try:
                    session = sessions.acquire(table.name, batch.schema)
                except flight.FlightError as exc:
                    raise from_flight(exc) from None
                if session is None:  # another thread's: this batch alone, as `lookup` does
                    yield lookup(table, batch)
                    continue
            yield from drain(lambda: len(sent) >= in_flight or sent_bytes + batch.nbytes > PIPELINE_BYTES)
            if session is None:  # the fallback closed it: open another for this batch
                session = sessions.acquire(table.name, batch.schema)
                if session is None:
                    yield lookup(table, batch)
                    continue
            try:
                session.send(batch)
            except (flight.FlightError, OSError, pa.ArrowException) as exc:
                if not isinstance(exc, _STREAM_BROKEN):
                    close(True)
                    raise from_flight(exc) if isinstance(exc, flight.FlightError) else exc from None
            sent.append(batch)
            sent_bytes += batch.nbytes
        yield from drain()
    finally:
        close(bool(sent))  # answers still due on the stream: it cannot serve the next lookup


def prefix_lookup(table, prefixes: Any) -> pa.Table:
    body = {"table": table.name, "prefixes": _ipc(as_arrow(prefixes))}
    return pa.ipc.open_stream(_call(table.client, PREFIX_LOOKUP, body)).read_all()


def snapshot(table) -> list[dict]:
    return json.loads(_call(table.client, KV_SNAPSHOT, {"table": table.name}))


def snapshots(table) -> list[list[dict]]:
    return json.loads(_call(table.client, KV_SNAPSHOTS, {"table": table.name}))


@dataclass
class FullRead:
    """A primary-key table read whole: its rows, then the changelog after them.
    `offsets[bucket]` is the exact changelog offset where each bucket's rows end. Read from
    the broker the rows are the current ones; read from remote snapshots they are the rows
    at each snapshot's offset (`sources[bucket]` says which), and `current()` applies the
    changelog after them."""

    rows: pa.Table
    offsets: dict[int, int]
    table: Any
    sources: dict[int, str] = field(default_factory=dict)  # bucket -> "broker" | "snapshot"
    bytes_read: int = 0  # fetched from the object store

    def changelog(self, columns=None, end=None):
        """The changelog after the rows (a Scan; `.follow()` tails it)."""
        cols = list(columns) if columns else ["_change", *self.table.schema.names]
        return self.table.scan(columns=cols, start=dict(self.offsets), end=end)

    def current(self) -> pa.Table:
        """The current rows: these rows with the changelog after them applied by key."""
        from fluvial.client.union import fold_changelog
        names = self.table.schema.names
        changes = self.changelog(["_change", *names]).to_arrow()
        return fold_changelog(self.rows, changes, list(self.table.info.primary_key))


def full_read(table, source: str = "broker") -> FullRead:
    if source not in ("broker", "snapshot"):
        raise ValueError(f"source must be 'broker' or 'snapshot', not {source!r}")
    parts, offsets, sources = [], {}, {}
    bytes_read = 0
    for b in range(table.info.buckets):
        if source == "snapshot":
            got = _snapshot_rows(table, b)
            if got is not None:
                rows, offsets[b], read = got
                parts.append(rows)
                sources[b] = "snapshot"
                bytes_read += read
                continue
        result = pa.ipc.open_stream(_call(table.client, FULL_READ, {"table": table.name, "bucket": b})).read_all()
        offsets[b] = int(result.schema.metadata[b"fluvial.log_offset"])
        parts.append(result.replace_schema_metadata(None))
        sources[b] = "broker"
    schema = parts[0].schema
    return FullRead(pa.concat_tables([p.cast(schema) if p.schema != schema else p for p in parts]), offsets, table,
                    sources, bytes_read)


def _snapshot_rows(table, bucket: int) -> tuple[pa.Table, int, int] | None:
    """The rows of the bucket's newest remote snapshot, read from the object store with the
    client's own credentials, with the offset they cover; None when there is none."""
    body = json.loads(_call(table.client, REMOTE_SNAPSHOT, {"table": table.name, "bucket": bucket}) or b"null")
    if not body or not body.get("snapshot"):
        return None
    from fluvial.client.remote import StoreCache
    from fluvial.tiering.kv_snapshots import RemoteKvSnapshot, read_snapshot_rows
    snap = RemoteKvSnapshot.from_json(body["snapshot"])
    stores = StoreCache(table.client.object_store_options)
    try:
        store = stores.open(body["store"])
        rows = read_snapshot_rows(store, snap)
        return rows, snap.log_offset, store.stats.bytes_read
    finally:
        stores.close()
