"""The registry's durable state in the broker's metadata store: schemas by global id, subject versions, configs."""
from __future__ import annotations

from dataclasses import dataclass

from fluvial.broker.metadata import MetadataStore

DDL = """
CREATE TABLE IF NOT EXISTS registry_schemas (
    id          INTEGER PRIMARY KEY,      -- the global schema id, never reused
    schema_type TEXT    NOT NULL,
    schema_text TEXT    NOT NULL,
    canonical   TEXT    NOT NULL,
    UNIQUE (schema_type, canonical)
);
CREATE TABLE IF NOT EXISTS registry_versions (
    subject   TEXT    NOT NULL,
    version   INTEGER NOT NULL,
    schema_id INTEGER NOT NULL REFERENCES registry_schemas(id),
    deleted   INTEGER NOT NULL DEFAULT 0,  -- 1 = soft-deleted
    PRIMARY KEY (subject, version)
);
CREATE INDEX IF NOT EXISTS registry_versions_by_id ON registry_versions(schema_id);
CREATE TABLE IF NOT EXISTS registry_config (
    subject       TEXT PRIMARY KEY,         -- '' holds the global level
    compatibility TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class StoredSchema:
    id: int
    schema_type: str
    text: str
    canonical: str


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int
    schema_id: int
    deleted: bool


class RegistryStore:
    """Reads and atomic writes of the registry's tables."""

    def __init__(self, metadata: MetadataStore):
        self.metadata = metadata
        metadata.ensure_schema(DDL)

    # -- schemas
    def schema_by_id(self, schema_id: int) -> StoredSchema | None:
        rows = self.metadata.query(
            "SELECT id, schema_type, schema_text, canonical FROM registry_schemas WHERE id = ?", (schema_id,))
        return StoredSchema(*rows[0]) if rows else None

    def schema_by_canonical(self, schema_type: str, canonical: str) -> StoredSchema | None:
        rows = self.metadata.query(
            "SELECT id, schema_type, schema_text, canonical FROM registry_schemas"
            " WHERE schema_type = ? AND canonical = ?", (schema_type, canonical))
        return StoredSchema(*rows[0]) if rows else None

    # -- subject versions
    def versions(self, subject: str, include_deleted: bool = False) -> list[SubjectVersion]:
        rows = self.metadata.query(
            "SELECT subject, version, schema_id, deleted FROM registry_versions WHERE subject = ?"
            + ("" if include_deleted else " AND deleted = 0") + " ORDER BY version", (subject,))
        return [SubjectVersion(r[0], r[1], r[2], bool(r[3])) for r in rows]

    def versions_of_schema(self, schema_id: int, include_deleted: bool = False) -> list[SubjectVersion]:
        rows = self.metadata.query(
            "SELECT subject, version, schema_id, deleted FROM registry_versions WHERE schema_id = ?"
            + ("" if include_deleted else " AND deleted = 0") + " ORDER BY subject, version", (schema_id,))
        return [SubjectVersion(r[0], r[1], r[2], bool(r[3])) for r in rows]

    def subjects(self, include_deleted: bool = False) -> list[str]:
        rows = self.metadata.query(
            "SELECT DISTINCT subject FROM registry_versions"
            + ("" if include_deleted else " WHERE deleted = 0") + " ORDER BY subject")
        return [r[0] for r in rows]

    def add_version(self, subject: str, schema_type: str, text: str, canonical: str) -> tuple[int, int]:
        """Store a new version of `subject` (and the schema, if new); returns (schema id, version)."""
        with self.metadata.transaction() as conn:
            row = conn.execute("SELECT id FROM registry_schemas WHERE schema_type = ? AND canonical = ?",
                               (schema_type, canonical)).fetchone()
            if row is None:
                schema_id = conn.execute(
                    "INSERT INTO registry_schemas (schema_type, schema_text, canonical) VALUES (?, ?, ?)",
                    (schema_type, text, canonical)).lastrowid
            else:
                schema_id = row[0]
            version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM registry_versions WHERE subject = ?",
                                   (subject,)).fetchone()[0]
            conn.execute("INSERT INTO registry_versions (subject, version, schema_id) VALUES (?, ?, ?)",
                         (subject, version, schema_id))
        return int(schema_id), int(version)

    def soft_delete(self, subject: str, versions: list[int]) -> None:
        with self.metadata.transaction() as conn:
            conn.executemany("UPDATE registry_versions SET deleted = 1 WHERE subject = ? AND version = ?",
                             [(subject, v) for v in versions])

    def hard_delete(self, subject: str, versions: list[int]) -> None:
        with self.metadata.transaction() as conn:
            conn.executemany("DELETE FROM registry_versions WHERE subject = ? AND version = ?",
                             [(subject, v) for v in versions])
            if not conn.execute("SELECT 1 FROM registry_versions WHERE subject = ? LIMIT 1", (subject,)).fetchone():
                conn.execute("DELETE FROM registry_config WHERE subject = ?", (subject,))

    # -- config
    def compatibility(self, subject: str) -> str | None:
        rows = self.metadata.query("SELECT compatibility FROM registry_config WHERE subject = ?", (subject,))
        return rows[0][0] if rows else None

    def set_compatibility(self, subject: str, level: str) -> None:
        with self.metadata.transaction() as conn:
            conn.execute("INSERT INTO registry_config (subject, compatibility) VALUES (?, ?)"
                         " ON CONFLICT(subject) DO UPDATE SET compatibility = excluded.compatibility",
                         (subject, level))

    def delete_compatibility(self, subject: str) -> None:
        with self.metadata.transaction() as conn:
            conn.execute("DELETE FROM registry_config WHERE subject = ?", (subject,))
