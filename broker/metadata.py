"""The broker's metadata store: one SQLite database under the data dir.

Each thread has its own SQLite connection. With one shared connection (and a lock around
it) a reader on the event loop waited for whatever commit another thread was fsyncing;
with WAL, readers on their own connections never wait for a writer, and writers queue
in SQLite itself (BEGIN IMMEDIATE with a busy timeout).

Each part of the broker owns its own tables (topics here; committed offsets in the
group coordinator; schemas in the registry) and creates them with
`MetadataStore.ensure_schema`. Writes go through `MetadataStore.transaction()` so that
a change is atomic and durable (WAL mode, synchronous=FULL) before it is acknowledged.
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Iterator


class MetadataStore:
    """A thread-safe handle on the broker's SQLite metadata database: one connection per thread."""

    # How long a writer waits for another thread's transaction before giving up.
    BUSY_TIMEOUT_S = 30.0

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._connection().execute("PRAGMA journal_mode=WAL")

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise sqlite3.ProgrammingError("the metadata store is closed")
            # check_same_thread=False only so that close() may close every thread's connection.
            conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None,
                                   timeout=self.BUSY_TIMEOUT_S)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def ensure_schema(self, ddl: str) -> None:
        """Run `CREATE TABLE IF NOT EXISTS ...` statements of one owner."""
        self._connection().executescript(ddl)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An atomic write: BEGIN IMMEDIATE ... COMMIT, rolled back on error."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def query(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        return self._connection().execute(sql, params).fetchall()

    def close(self) -> None:
        with self._all_lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
