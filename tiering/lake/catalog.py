"""The lake's Iceberg catalog: where lake tables live, how they are created and evolved, and
the offsets a lake snapshot covers.

Embedded default: pyiceberg's SQL catalog on `<data-dir>/lake/catalog.db` (SQLite) with the
warehouse folder `<data-dir>/lake/warehouse`; any other catalog (REST, SQL on a server,
Glue, ...) by pyiceberg `load_catalog` properties (broker option `--lake-catalog-option`).
Every lake commit's snapshot summary holds `fluvial.offsets`, the exclusive end offset of
every bucket: the lake holds exactly the offsets below it. It is the one record of what is
tiered; the broker's coordinator only schedules.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from fluvial.tiering.lake.schema import lake_arrow_schema

NAMESPACE = "fluvial"
CATALOG_NAME = "fluvial"
OFFSETS_PROPERTY = "fluvial.offsets"
# Table property: the topic id of the Fluvial table a lake table belongs to.
TOPIC_ID_PROPERTY = "fluvial.topic-id"
# A lake commit must fail, not be rebased, when another commit landed since the job read
# the lake's offsets: pyiceberg retries conflicting appends by default, which would tier the
# same offsets twice.
TABLE_PROPERTIES = {"commit.retry.num-retries": "0", "format-version": "2"}
_SECRET = re.compile(r"secret|password|token|credential|access-key|session-key|private", re.I)


def embedded_properties(data_dir: Path | str) -> dict[str, str]:
    lake = Path(data_dir).absolute() / "lake"
    return {"type": "sql", "uri": f"sqlite:///{lake / 'catalog.db'}", "warehouse": f"file://{lake / 'warehouse'}"}


def catalog_properties(data_dir: Path | str, options: dict[str, str] | None) -> dict[str, str]:
    """The pyiceberg properties of the broker's lake catalog."""
    return dict(options) if options else embedded_properties(data_dir)


def public_properties(properties: dict[str, str]) -> dict[str, str]:
    """Properties a reader may be given: everything but secrets (keys, passwords, tokens)."""
    return {k: v for k, v in properties.items() if not _SECRET.search(k)}


def open_catalog(properties: dict[str, str]):
    """A pyiceberg catalog from properties (`type` sql, rest, glue, ...; `uri`, `warehouse`)."""
    from pyiceberg.catalog import load_catalog

    props = dict(properties)
    if props.get("type", "sql") == "sql" and props.get("uri", "").startswith("sqlite:///"):
        Path(props["uri"][len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        if props.get("warehouse", "").startswith("file://"):
            Path(props["warehouse"][len("file://"):]).mkdir(parents=True, exist_ok=True)
    return load_catalog(props.pop("name", CATALOG_NAME), **props)


def identifier(table: str) -> tuple[str, str]:
    return (NAMESPACE, table)


def iceberg_schema(arrow_schema: pa.Schema, primary_key: list[str] | None):
    """An Iceberg schema (fresh field ids) for lake columns, the primary key as identifier fields."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    schema = assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema))
    if not primary_key:
        return schema
    ids = [schema.find_field(name).field_id for name in primary_key]
    return Schema(*schema.fields, identifier_field_ids=ids)


def ensure_lake_table(catalog, name: str, user_schema: pa.Schema, primary_key: list[str] | None, raw: bool,
                      topic_id: str | None = None):
    """Create the lake table of a Fluvial table, or add the columns the table gained since
    (Iceberg schema evolution: existing rows read the new columns as null). Returns it.

    With `topic_id` (the broker's call): a lake table left by an earlier, deleted table of
    the same name (its offsets mean nothing for the new one) is kept under
    `<name>__<its topic id>` and a new one is made."""
    from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError

    target = lake_arrow_schema(user_schema, primary_key, raw)
    _ensure_namespace(catalog)
    props = {**TABLE_PROPERTIES, **({TOPIC_ID_PROPERTY: topic_id} if topic_id else {})}
    try:
        table = catalog.load_table(identifier(name))
        owner = table.properties.get(TOPIC_ID_PROPERTY)
        if topic_id and owner and owner != topic_id:
            catalog.rename_table(identifier(name), (NAMESPACE, f"{name}__{owner.replace('-', '')}"))
            raise NoSuchTableError(name)
    except NoSuchTableError:
        try:
            return catalog.create_table(identifier(name), schema=iceberg_schema(target, primary_key),
                                        properties=props)
        except TableAlreadyExistsError:  # created meanwhile by the broker or another job
            table = catalog.load_table(identifier(name))
    have = set(table.schema().column_names)
    if any(f.name not in have for f in target):
        with table.update_schema() as update:
            update.union_by_name(target)
        table = catalog.load_table(identifier(name))
    if any(table.properties.get(k) != v for k, v in TABLE_PROPERTIES.items() if k != "format-version"):
        with table.transaction() as txn:
            txn.set_properties({k: v for k, v in TABLE_PROPERTIES.items() if k != "format-version"})
        table = catalog.load_table(identifier(name))
    return table


def _ensure_namespace(catalog) -> None:
    try:
        catalog.create_namespace_if_not_exists(NAMESPACE)
    except Exception:
        # Another process (the broker, a job) created it at the same moment.
        if (NAMESPACE,) not in [tuple(n) for n in catalog.list_namespaces()]:
            raise


def load_lake_table(catalog, name: str):
    """The lake table, or None when it does not exist (yet)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier(name))
    except NoSuchTableError:
        return None


def snapshot_offsets(snapshot) -> dict[int, int]:
    """{bucket: end offset} a lake snapshot covers ({} for none or a snapshot not made by tiering)."""
    if snapshot is None:
        return {}
    text = snapshot.summary.get(OFFSETS_PROPERTY) if snapshot.summary is not None else None
    if not text:
        return {}
    return {int(k): int(v) for k, v in json.loads(text).items()}


def lake_state(table) -> tuple[int | None, dict[int, int], int | None]:
    """(current snapshot id, offsets it covers, its commit time in ms) of a lake table."""
    snapshot = table.current_snapshot() if table is not None else None
    if snapshot is None:
        return None, {}, None
    return snapshot.snapshot_id, snapshot_offsets(snapshot), snapshot.timestamp_ms


def offsets_json(offsets: dict[int, int]) -> str:
    return json.dumps({str(b): int(o) for b, o in sorted(offsets.items())})


def lake_info(properties: dict[str, str], name: str, table: Any, state: str, freshness_ms: int) -> dict:
    """The `lake-info` answer for a lake-enabled table (`table`: the loaded lake table or None).
    `metadata_location` (the metadata file holding that snapshot) lets readers find the
    snapshot's files without a catalog round trip or pyiceberg (client/lake_files.py)."""
    snapshot_id, offsets, _ = lake_state(table)
    return {"format": "iceberg", "catalog": public_properties(properties), "identifier": list(identifier(name)),
            "snapshot_id": snapshot_id, "offsets": {str(b): o for b, o in sorted(offsets.items())},
            "state": state, "freshness_ms": freshness_ms,
            "metadata_location": table.metadata_location if table is not None else None}
