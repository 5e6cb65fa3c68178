"""The broker's metadata store: one SQLite database under the data dir.

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
    """A thread-safe handle on the broker's SQLite metadata database."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")

    def ensure_schema(self, ddl: str) -> None:
        """Run `CREATE TABLE IF NOT EXISTS ...` statements of one owner."""
        with self._lock:
            self._conn.executescript(ddl)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """An atomic write: BEGIN IMMEDIATE ... COMMIT, rolled back on error."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            else:
                self._conn.execute("COMMIT")

    def query(self, sql: str, params: tuple | dict = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
