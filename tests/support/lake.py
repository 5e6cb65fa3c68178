"""Lake tables written the way the tiering contract says (identifier `fluvial.<table>`, user
columns plus `_bucket`/`_offset`/`_timestamp` for log tables, `fluvial.offsets` in each
snapshot's summary), for tests that need a lake in an exact state: a given set of offsets
tiered, several rounds, files out of offset order."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

NAMESPACE = "fluvial"


def sql_catalog(folder: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    folder.mkdir(parents=True, exist_ok=True)
    props = {"uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}
    catalog = SqlCatalog("fluvial", **props)
    catalog.create_namespace_if_not_exists(NAMESPACE)
    return catalog, {"type": "sql", **props}


def _lake_schema(table) -> pa.Schema:
    users = [f.remove_metadata() for f in table.schema]
    if table.info.primary_key:
        return pa.schema([f.with_nullable(f.nullable and f.name not in table.info.primary_key) for f in users])
    return pa.schema([*users, pa.field("_bucket", pa.int32(), False), pa.field("_offset", pa.int64(), False),
                      pa.field("_timestamp", pa.timestamp("us", tz="UTC"), False)])


def tier_log_rows(catalog, table, upto: dict[int, int], *, reverse_files: bool = False):
    """Copy offsets [previous end, upto[b]) of every bucket of log table `table` into its
    lake table, as one commit per call (one data file per bucket)."""
    from pyiceberg.exceptions import NoSuchTableError

    ident = (NAMESPACE, table.name)
    schema = _lake_schema(table)
    try:
        iceberg = catalog.load_table(ident)
    except NoSuchTableError:
        iceberg = catalog.create_table(ident, schema=schema)
    done = _offsets(iceberg)
    cols = [*table.schema.names, "_bucket", "_offset", "_timestamp"]
    parts = []
    for b in sorted(upto, reverse=reverse_files):
        start = done.get(b, 0)
        if upto[b] > start:
            rows = table.scan(columns=cols, start={b: start}, end={b: upto[b]}, buckets=[b], source="log").to_arrow()
            if reverse_files:  # files whose rows are not in offset order
                rows = rows.take(pa.array(range(rows.num_rows - 1, -1, -1)))
            parts.append(rows)
    new = {str(b): max(done.get(b, 0), upto.get(b, 0)) for b in {*done, *upto}}
    data = pa.concat_tables(parts) if parts else schema.empty_table()
    data = pa.Table.from_arrays([data.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema)
    iceberg.append(data, snapshot_properties={"fluvial.offsets": json.dumps(new)})
    return iceberg


def tier_pk_state(catalog, table, state: pa.Table, offsets: dict[int, int]):
    """Replace the lake table of primary-key table `table` with `state` (its rows as of
    changelog `offsets`), as one overwrite commit."""
    from pyiceberg.exceptions import NoSuchTableError

    ident = (NAMESPACE, table.name)
    schema = _lake_schema(table)
    try:
        iceberg = catalog.load_table(ident)
    except NoSuchTableError:
        iceberg = catalog.create_table(ident, schema=schema)
        with iceberg.update_schema() as update:
            update.set_identifier_fields(*table.info.primary_key)
    data = pa.Table.from_arrays([state.column(n).cast(schema.field(n).type) for n in schema.names], schema=schema)
    iceberg.overwrite(data, snapshot_properties={"fluvial.offsets": json.dumps({str(b): o for b, o in offsets.items()})})
    return iceberg


def _offsets(iceberg) -> dict[int, int]:
    snap = iceberg.current_snapshot()
    if snap is None:
        return {}
    return {int(k): v for k, v in json.loads(snap.summary.additional_properties["fluvial.offsets"]).items()}


def lake_info_for(iceberg, props: dict, with_location: bool = True) -> dict:
    """The `lake-info` answer the broker gives for this lake table (without the metadata
    location, readers go through the catalog and pyiceberg)."""
    snap = iceberg.current_snapshot()
    return {"format": "iceberg", "catalog": props, "identifier": list(iceberg.name()),
            "snapshot_id": snap.snapshot_id if snap else None,
            "offsets": _offsets(iceberg), "state": "tiered", "freshness_ms": 30000,
            "metadata_location": iceberg.metadata_location if with_location else None}


def sort_rows(t: pa.Table, keys: list[str]) -> list[dict]:
    return t.take(pc.sort_indices(t, [(k, "ascending") for k in keys])).to_pylist()
