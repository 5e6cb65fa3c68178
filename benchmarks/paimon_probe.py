"""Can pypaimon serve as a second lake format? Writes an append table and a primary-key table
(upserts, then deletes through a row-kind column) from Arrow, commits with snapshot
properties (where `fluvial.offsets` would go), reads both back and checks the rows.

pypaimon pins pyarrow < 20 and pandas < 3, which the project's environment cannot take
(see docs/architecture.md, "Lake formats: Paimon"), so run it in a virtual environment
of its own:

    python3 -m venv /tmp/paimon && /tmp/paimon/bin/pip install pypaimon
    /tmp/paimon/bin/python benchmarks/paimon_probe.py     # -> benchmarks/results/paimon_probe.json

and, to see whether only the pins stand in the way, in one with the project's pyarrow and
pandas and pypaimon installed with `pip install --no-deps pypaimon` (its other
requirements by hand): `--out benchmarks/results/paimon_probe_pyarrow26.json`.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

import pyarrow as pa

SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("city", pa.string()), ("amount", pa.float64())])


def _commit(table, data: pa.Table, props: dict[str, str]) -> None:
    builder = table.new_batch_write_builder()
    write, commit = builder.new_write(), builder.new_commit()
    try:
        write.write_arrow(data)
        commit.commit(write.prepare_commit(), snapshot_properties=props)
    finally:
        write.close()
        commit.close()


def _read(table) -> pa.Table:
    rb = table.new_read_builder()
    return rb.new_read().to_arrow(rb.new_scan().plan().splits()).sort_by("id")


def probe() -> dict:
    from pypaimon import CatalogFactory, Schema

    out: dict = {"pypaimon": metadata.version("pypaimon"), "pyarrow": pa.__version__,
                 "requires": [r for r in metadata.requires("pypaimon") or [] if "extra" not in r]}
    folder = tempfile.mkdtemp()
    catalog = CatalogFactory.create({"warehouse": f"file://{folder}/warehouse"})
    catalog.create_database("fluvial", True)
    b1 = pa.table({"id": [1, 2, 3], "city": ["a", "b", None], "amount": [1.0, 2.0, 3.0]}, schema=SCHEMA)
    b2 = pa.table({"id": [2, 4], "city": ["B", "d"], "amount": [20.0, 4.0]}, schema=SCHEMA)

    # Append table: every row once.
    catalog.create_table("fluvial.log", Schema.from_pyarrow_schema(SCHEMA), False)
    log = catalog.get_table("fluvial.log")
    _commit(log, b1, {"fluvial.offsets": '{"0": 3}'})
    _commit(log, b2, {"fluvial.offsets": '{"0": 5}'})
    rows = _read(log).to_pylist()
    out["append_ok"] = len(rows) == 5

    # Primary-key table: upserts merge on read; deletes through a row-kind column.
    pk_schema = SCHEMA.append(pa.field("_kind", pa.string()))
    catalog.create_table("fluvial.pk", Schema.from_pyarrow_schema(
        pk_schema, primary_keys=["id"], options={"bucket": "2", "rowkind.field": "_kind"}), False)
    pk = catalog.get_table("fluvial.pk")
    start = time.perf_counter()
    _commit(pk, b1.append_column("_kind", pa.array(["+I"] * 3)), {"fluvial.offsets": '{"0": 3}'})
    _commit(pk, b2.append_column("_kind", pa.array(["+U", "+I"])), {"fluvial.offsets": '{"0": 5}'})
    _commit(pk, pa.table({"id": [3], "city": [None], "amount": [None], "_kind": ["-D"]},
                         schema=pk_schema), {"fluvial.offsets": '{"0": 6}'})
    out["pk_commit_seconds"] = round(time.perf_counter() - start, 3)
    state = [{k: r[k] for k in ("id", "city", "amount")} for r in _read(pk).to_pylist()]
    out["pk_state"] = state
    out["pk_ok"] = state == [{"id": 1, "city": "a", "amount": 1.0}, {"id": 2, "city": "B", "amount": 20.0},
                             {"id": 4, "city": "d", "amount": 4.0}]
    snap = pk.snapshot_manager().get_latest_snapshot() if hasattr(pk, "snapshot_manager") else None
    out["snapshot_properties"] = getattr(snap, "properties", None) if snap is not None else None
    return out


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "paimon_probe.json"))
    ap.add_argument("--note", default="", help="how this environment was made (recorded with the result)")
    args = ap.parse_args()
    result: dict = {"python": sys.version.split()[0], "machine": platform.machine(), "loadavg": os.getloadavg()}
    try:
        result.update(probe())
    except Exception as exc:  # noqa: BLE001 - the probe reports what fails
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
    print(json.dumps(result, indent=2, default=str))
    result["note"] = args.note
    target = Path(args.out)
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
