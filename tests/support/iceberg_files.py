"""An Iceberg reader that shares no code with pyiceberg: the catalog's SQLite row gives the
metadata file, fastavro reads the manifest list and manifests, DuckDB reads the live data files."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import fastavro


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def metadata_location(catalog_db: Path, table: str, namespace: str = "fluvial") -> str:
    with sqlite3.connect(str(catalog_db)) as conn:
        row = conn.execute("SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
                           (namespace, table)).fetchone()
    assert row is not None, f"{namespace}.{table} is not in {catalog_db}"
    return row[0]


def current_snapshot(metadata_path: str) -> dict | None:
    meta = json.loads(Path(_local(metadata_path)).read_text())
    sid = meta.get("current-snapshot-id")
    return next((s for s in meta.get("snapshots", []) if s["snapshot-id"] == sid), None)


def live_files(metadata_path: str) -> tuple[list[str], list[str]]:
    """(data files, delete files) of the current snapshot."""
    snapshot = current_snapshot(metadata_path)
    if snapshot is None:
        return [], []
    data, deletes = [], []
    with open(_local(snapshot["manifest-list"]), "rb") as f:
        manifests = [m["manifest_path"] for m in fastavro.reader(f)]
    for manifest in manifests:
        with open(_local(manifest), "rb") as f:
            for entry in fastavro.reader(f):
                if entry["status"] == 2:  # DELETED
                    continue
                file = entry["data_file"]
                (data if file.get("content", 0) == 0 else deletes).append(_local(file["file_path"]))
    return data, deletes


def duckdb_rows(catalog_db: Path, table: str, columns: str = "*", order: str | None = None) -> list[tuple]:
    """The table's current rows as DuckDB reads its data files (no delete files expected:
    primary-key tables are kept copy-on-write)."""
    import duckdb

    data, deletes = live_files(metadata_location(catalog_db, table))
    assert not deletes, f"delete files would need merge-on-read: {deletes}"
    if not data:
        return []
    sql = f"SELECT {columns} FROM read_parquet({data!r}, union_by_name = true)"
    if order:
        sql += f" ORDER BY {order}"
    return duckdb.connect().execute(sql).fetchall()
