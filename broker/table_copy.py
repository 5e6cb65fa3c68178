"""`fluvial table copy` and `fluvial table load`: long copies into a table, with progress.

A copy scans the source table (only the columns asked for, filters pushed down) and
appends what it reads to the target; a load (backfill) appends the rows of a Parquet,
Arrow IPC or CSV file. Both go through the table API, so the broker converts, stores and
(under flush policy ack) fsyncs every append before it is counted as done. Progress is a
bar on a terminal and a one-line summary at the end.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

import pyarrow as pa

from fluvial.progress import cli_progress

# Appends of about this many rows: large enough to amortise a round trip, small enough that
# progress moves and a failure loses little.
APPEND_ROWS = 50_000


def rechunk(batches: Iterable[pa.RecordBatch], rows: int = APPEND_ROWS) -> Iterator[pa.RecordBatch]:
    """The same rows in batches of `rows` (the last one smaller): small scan batches merged,
    large ones split (slices, no copy)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(rows - count, batch.num_rows - offset)
            pending.append(batch.slice(offset, take))
            count += take
            offset += take
            if count == rows:
                yield pa.concat_batches(pending) if len(pending) > 1 else pending[0]
                pending, count = [], 0
    if pending:
        yield pa.concat_batches(pending) if len(pending) > 1 else pending[0]


def copy_table(client, source: str, target: str, *, columns: list[str] | None = None, filters=None,
               create: bool = False, progress: bool | None = None) -> int:
    """Append the rows of `source` (up to its high watermarks now) to `target`; returns rows copied."""
    src = client.table(source)
    if create and target not in client.list_tables():
        schema = src.schema if columns is None else pa.schema([src.schema.field(c) for c in columns])
        client.create_table(target, pa.schema([f.remove_metadata() for f in schema]), buckets=src.info.buckets)
    dst = client.table(target)
    total = None if filters else sum(o.high_watermark - o.log_start for o in src.offsets())
    scan = src.scan(columns=columns, filter=filters or None, source="log")
    copied = 0
    with cli_progress(f"copy {source} -> {target}", total, "rows", enabled=progress) as bar:
        stream = scan.to_batches()
        try:
            for batch in rechunk(stream):
                dst.append(batch)
                copied += batch.num_rows
                bar.advance(batch.num_rows)
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
    return copied


def _file_batches(path: Path) -> tuple[int | None, Iterator[pa.RecordBatch]]:
    """(row count if known, batches) of a Parquet, Arrow IPC (file or stream) or CSV file."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq
        f = pq.ParquetFile(path)
        return f.metadata.num_rows, f.iter_batches(batch_size=APPEND_ROWS)
    if suffix in (".arrow", ".arrows", ".ipc", ".feather"):
        try:
            reader = pa.ipc.open_file(path)
            return reader.count_rows(), (reader.get_record_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            return None, iter(pa.ipc.open_stream(path))
    if suffix == ".csv":
        import pyarrow.csv as pcsv
        return None, iter(pcsv.open_csv(path))
    raise SystemExit(f"{path}: load reads .parquet, .arrow/.arrows/.ipc/.feather or .csv files")


def load_file(client, table: str, path: Path, *, progress: bool | None = None) -> int:
    """Append the rows of a file to `table`, cast to its columns; returns rows loaded."""
    target = client.table(table)
    schema = pa.schema([f.remove_metadata() for f in target.schema])
    total, batches = _file_batches(path)
    loaded = 0
    with cli_progress(f"load {path.name} -> {table}", total, "rows", enabled=progress) as bar:
        for batch in rechunk(batches):
            missing = [n for n in schema.names if n not in batch.schema.names]
            if missing:
                raise ValueError(f"{path} has no column(s) {missing} of table {table!r}")
            batch = pa.RecordBatch.from_arrays([batch.column(n).cast(schema.field(n).type) for n in schema.names],
                                               schema=schema)
            target.append(batch)
            loaded += batch.num_rows
            bar.advance(batch.num_rows)
    return loaded


def run_copy(args) -> int:
    from fluvial.broker.table_cli import _connect, _fail, parse_where
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    filters = [parse_where(w) for w in args.where or []]
    started = time.monotonic()
    try:
        with _connect(args) as client:
            n = copy_table(client, args.source, args.target, columns=columns, filters=filters, create=args.create)
    except KeyboardInterrupt:
        print("interrupted: rows appended so far stay in the target", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a tool reports every failure the same way
        return _fail(exc)
    print(f"copied {n:,} rows from {args.source} to {args.target} in {time.monotonic() - started:.1f} s")
    return 0


def run_load(args) -> int:
    from fluvial.broker.table_cli import _connect, _fail
    started = time.monotonic()
    try:
        with _connect(args) as client:
            n = load_file(client, args.table, Path(args.file))
    except KeyboardInterrupt:
        print("interrupted: rows appended so far stay in the table", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    print(f"loaded {n:,} rows from {args.file} into {args.table} in {time.monotonic() - started:.1f} s")
    return 0


def add_parsers(ts, url_arg) -> None:
    """`table copy` and `table load` under the `table` command's subparsers."""
    q = ts.add_parser("copy", help="append a table's rows (some columns, filtered) to another table, with progress")
    q.add_argument("source")
    q.add_argument("target")
    q.add_argument("--columns", help="comma-separated columns to copy (default all)")
    q.add_argument("--where", action="append", metavar="'COLUMN OP VALUE'", help="copy only matching rows (repeat: AND)")
    q.add_argument("--create", action="store_true", help="create the target (a log table of the copied columns)")
    url_arg(q)
    q.set_defaults(run=run_copy)
    q = ts.add_parser("load", help="backfill a table from a Parquet, Arrow IPC or CSV file, with progress")
    q.add_argument("table")
    q.add_argument("file")
    url_arg(q)
    q.set_defaults(run=run_load)
