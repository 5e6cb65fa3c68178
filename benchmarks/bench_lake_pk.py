"""How a primary-key lake table takes a round of changes: Fluvial's copy-on-write commit
(delete the changed keys, append their current rows, one commit) against pyiceberg's
`Table.upsert` (which diffs against the table, then overwrites matching rows).

A table of `--keys` keys (id, name, amount), in `--files` data files, takes rounds of
`--changes` changed keys (10% of them deletes); median time per round of `--runs`, on
the embedded SQLite catalog in a temp dir. Saves benchmarks/results/lake_pk.json.

    python -m benchmarks.bench_lake_pk [--keys 200000] [--changes 10000] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks import machine
from fluvial.tiering.lake import catalog as lake_catalog
from fluvial.tiering.lake.writer import commit_round

RESULTS = Path(__file__).parent / "results" / "lake_pk.json"
SCHEMA = pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string()), ("amount", pa.float64())])


def rows(ids: np.ndarray, round_: int) -> pa.Table:
    return pa.table({"id": ids, "name": pa.array(np.char.add(f"r{round_}-", (ids % 1000).astype(str))),
                     "amount": ids * 0.5 + round_}, schema=SCHEMA)


def fresh_table(catalog, name: str, keys: int, files: int):
    table = lake_catalog.ensure_lake_table(catalog, name, SCHEMA, ["id"], raw=False)
    snapshot = None
    for part in np.array_split(np.arange(keys, dtype=np.int64), files):
        snapshot = commit_round(table, snapshot, {0: int(part[-1]) + 1}, upserts=rows(part, 0),
                                deleted=pa.table({"id": pa.array([], pa.int64())}), primary_key=["id"])
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=200_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--changes", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    rng = np.random.default_rng(1)
    out: dict = {"machine": machine.describe(), "keys": args.keys, "files": args.files, "changes": args.changes,
                 "loadavg_start": os.getloadavg()}
    times: dict[str, list[float]] = {"copy_on_write_commit": [], "pyiceberg_upsert_then_delete": []}
    with tempfile.TemporaryDirectory(prefix="bench-lake-pk-") as tmp:
        catalog = lake_catalog.open_catalog(lake_catalog.embedded_properties(tmp))
        for run in range(args.runs):
            changed = np.sort(rng.choice(args.keys, args.changes, replace=False)).astype(np.int64)
            deleted, upserted = changed[: args.changes // 10], changed[args.changes // 10:]
            a = fresh_table(catalog, f"cow{run}", args.keys, args.files)
            began = time.perf_counter()
            commit_round(a, a.current_snapshot().snapshot_id, {0: args.keys + 1}, upserts=rows(upserted, run + 1),
                         deleted=pa.table({"id": deleted}), primary_key=["id"])
            times["copy_on_write_commit"].append(time.perf_counter() - began)
            b = fresh_table(catalog, f"ups{run}", args.keys, args.files)
            from pyiceberg.expressions import In
            began = time.perf_counter()
            b.upsert(rows(upserted, run + 1), join_cols=["id"])
            b.delete(In("id", set(deleted.tolist())))
            times["pyiceberg_upsert_then_delete"].append(time.perf_counter() - began)
            got_a = a.scan().to_arrow().sort_by("id")
            got_b = b.scan().to_arrow().sort_by("id")
            assert got_a.equals(got_b.cast(got_a.schema)), "the two ways disagree"
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    out["median_s"] = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out["runs_s"] = {k: [round(x, 3) for x in v] for k, v in times.items()}
    out["loadavg_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
