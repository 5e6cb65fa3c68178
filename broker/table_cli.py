"""`fluvial table ...` and `fluvial scan ...`: tables through the table API (Arrow Flight)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Iterable

import pyarrow as pa

from fluvial.broker.cli import subcommand
from fluvial.client.cli_options import add_connection_arguments, security_from_args

TYPES = {
    "int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
    "bool": pa.bool_(), "bytes": pa.binary(), "date": pa.date32(), "timestamp": pa.timestamp("ms", tz="UTC"),
}
_WHERE = re.compile(r"^\s*(\S+)\s+(=|!=|<=|>=|<|>|not in|in|is_null|not_null)\s*(.*?)\s*$")


def _url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="grpc://127.0.0.1:8815", help="the broker's table API (Flight) location")
    add_connection_arguments(p)


def _connect(args):
    from fluvial.client import Client
    return Client(args.url, security=security_from_args(args))


def _fail(exc: Exception) -> int:
    print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1


def parse_column(spec: str) -> pa.Field:
    """`name:type`, with `!` after the type for a column that must hold a value (`id:long!`)."""
    name, _, kind = spec.partition(":")
    required = kind.endswith("!")
    kind = kind.rstrip("!")
    if not name or kind not in TYPES:
        raise SystemExit(f"column {spec!r} must be name:type (type one of {', '.join(TYPES)}; '!' = required)")
    return pa.field(name, TYPES[kind], nullable=not required)


def parse_where(text: str) -> tuple[str, str, Any]:
    """`price > 10`, `city in ["Oslo","Lima"]`, `note is_null`: values are JSON, else text."""
    try:
        return parse_where_text(text)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def parse_where_text(text: str) -> tuple[str, str, Any]:
    """Like `parse_where`, raising ValueError for text that is not a filter (the console's use)."""
    m = _WHERE.match(text)
    if m is None:
        raise ValueError(f"filter {text!r} must look like 'column op value' (ops = != < <= > >= in, not in, "
                         "is_null, not_null)")
    column, op, raw = m.groups()
    if op in ("is_null", "not_null"):
        return column, op, None
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return column, op, value


def format_rows(table: pa.Table, max_width: int = 40) -> str:
    """A plain text grid of the rows."""
    names = table.column_names
    cells = [[cell_text(v, max_width) for v in col.to_pylist()] for col in table.columns]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, cells)]
    lines = [" | ".join(n.ljust(w) for n, w in zip(names, widths)),
             "-+-".join("-" * w for w in widths)]
    for i in range(table.num_rows):
        lines.append(" | ".join(col[i].ljust(w) for col, w in zip(cells, widths)))
    return "\n".join(lines)


def cell_text(value: Any, max_width: int) -> str:
    """One value as text: bytes as text when printable, else hex; long values cut."""
    text = "null" if value is None else value.hex() if isinstance(value, bytes) and not _printable(value) \
        else value.decode() if isinstance(value, bytes) else str(value)
    return text if len(text) <= max_width else text[:max_width - 1] + "…"


def _printable(b: bytes) -> bool:
    try:
        return b.decode().isprintable()
    except UnicodeDecodeError:
        return False


# ---- tables -----------------------------------------------------------------

def table_list(args) -> int:
    try:
        with _connect(args) as client:
            for name in client.list_tables():
                print(name)
    except Exception as exc:  # noqa: BLE001 - a tool reports every failure the same way
        return _fail(exc)
    return 0


def table_describe(args) -> int:
    try:
        with _connect(args) as client:
            info = client.describe(args.table)
            storage = client.storage_status(args.table)
            lake = client.lake_status(args.table) if info.configs.get("fluvial.lake.enable") == "true" else None
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    print(f"table {info.name}: {info.kind} table, {info.buckets} bucket(s), Kafka values {info.kafka_format}")
    columns = pa.table({
        "field_id": [int((f.metadata or {}).get(b"fluvial.field_id", b"-1")) for f in info.schema],
        "column": info.schema.names,
        "type": [str(f.type) for f in info.schema],
        "nullable": [f.nullable for f in info.schema],
        "kafka_value_type": _kafka_types(info)})
    print(format_rows(columns))
    print()
    print(format_rows(pa.table({"bucket": [o.bucket for o in info.offsets],
                                "log_start": [o.log_start for o in info.offsets],
                                "high_watermark": [o.high_watermark for o in info.offsets]})))
    print()
    buckets = storage["buckets"]
    print(format_rows(pa.table({
        "bucket": [b["bucket"] for b in buckets],
        "local_start": [b["local"]["start_offset"] for b in buckets],
        "local_bytes": [b["local"]["bytes"] for b in buckets],
        "local_segments": [b["local"]["segments"] for b in buckets],
        "remote_start": [b["remote"]["start_offset"] for b in buckets],
        "remote_end": [b["remote"]["end_offset"] for b in buckets],
        "remote_bytes": [b["remote"]["bytes"] for b in buckets],
        "remote_segments": [b["remote"]["segments"] for b in buckets]})))
    print(f"object store: {storage['object_store']['url']}")
    if info.kv_stats and info.kv_stats.get("retract"):
        r = info.kv_stats["retract"]
        print()
        print(f"retract state: {r['keys']} key(s), {r['rows']} live row(s), {r['rows_per_key']} per key; "
              f"retractions that found no row {r['retracts_absent']}, rows expired {r['rows_expired']}")
        hist = r["rows_per_key_histogram"]
        print(format_rows(pa.table({"rows_per_key": list(hist), "keys": list(hist.values())})))
    if lake:
        from fluvial.tiering.lake.cli import print_status
        print()
        print_status(lake)
    return 0


def _kafka_types(info) -> list[str]:
    """How Kafka clients see each stored column in the table's value format."""
    plain = pa.schema([f.remove_metadata() for f in info.schema])
    try:
        if info.kafka_format == "json":
            from fluvial.schema.arrow_mapping import arrow_to_json_schema
            props = arrow_to_json_schema(plain)["properties"]
            return [_json_type_text(props[n]) for n in plain.names]
        if info.kafka_format == "avro":
            from fluvial.schema.arrow_mapping import arrow_to_avro
            return [_avro_type_text(f["type"]) for f in arrow_to_avro(plain)["fields"]]
    except Exception:  # noqa: BLE001 - a description shows what it can
        pass
    return ["" for _ in plain.names]


def _avro_type_text(t: Any) -> str:
    if isinstance(t, list):  # a nullable column: ["null", T]
        return " | ".join(_avro_type_text(b) for b in t if b != "null")
    if isinstance(t, dict):
        logical = t.get("logicalType")
        return f"{t['type']} ({logical})" if logical else str(t["type"])
    return str(t)


def _json_type_text(node: dict) -> str:
    node = node.get("anyOf", [node])[0]
    t = node.get("type")
    t = [x for x in t if x != "null"][0] if isinstance(t, list) else t
    extra = node.get("format") or node.get("x-arrow-type")
    return f"{t} ({extra})" if extra else str(t)


def table_create(args) -> int:
    schema = pa.schema([parse_column(c) for c in args.column]) if args.column else None
    configs = {}
    for item in args.config or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"config {item!r} must look like name=value")
        configs[k] = v
    try:
        with _connect(args) as client:
            t = client.create_table(args.table, schema, buckets=args.buckets, kafka_format=args.kafka_format,
                                    configs=configs, primary_key=_columns(args.primary_key),
                                    bucket_key=_columns(args.bucket_key), merge_engine=args.merge_engine,
                                    version_column=args.version_column, upsert_key=_columns(args.upsert_key),
                                    retract_state_ttl_ms=args.retract_state_ttl_ms,
                                    aggregates=_aggregates(args.agg))
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    print(f"created table {t.name} ({t.info.buckets} bucket(s), Kafka values {t.info.kafka_format})")
    stored = {f.name: f.type for f in t.info.schema}
    for f in schema or []:
        if stored.get(f.name) not in (None, f.type):
            print(f"note: column {f.name!r} is stored as {stored[f.name]}: {t.info.kafka_format} values cannot "
                  f"hold {f.type} (use --kafka-format avro to keep it)", file=sys.stderr)
    return 0


def _aggregates(items: list[str] | None) -> dict[str, str] | None:
    out = {}
    for item in items or []:
        column, sep, function = item.partition("=")
        if not sep or not column or not function:
            raise SystemExit(f"--agg {item!r} must look like column=function")
        out[column.strip()] = function.strip()
    return out or None


def _columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def table_drop(args) -> int:
    try:
        with _connect(args) as client:
            client.drop_table(args.table)
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    print(f"dropped table {args.table}")
    return 0


def table_compact(args) -> int:
    try:
        with _connect(args) as client:
            buckets = client._action("compact", {"table": args.table})
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    for b in buckets:
        print(f"bucket {b['bucket']}: {b.get('records_before', 0)} -> {b.get('records_after', 0)} records, "
              f"{b.get('segments_rewritten', 0)} segments rewritten, {b.get('tombstones_removed', 0)} tombstones removed")
    return 0


@subcommand
def register_table(sub) -> None:
    p = sub.add_parser("table", help="list, describe, create and drop tables (table API)")
    ts = p.add_subparsers(dest="table_command", required=True)
    q = ts.add_parser("list")
    _url_arg(q)
    q.set_defaults(run=table_list)
    q = ts.add_parser("describe")
    q.add_argument("table")
    _url_arg(q)
    q.set_defaults(run=table_describe)
    q = ts.add_parser("create", help="a log table; without --column a raw table (binary 'value')")
    q.add_argument("table")
    q.add_argument("--column", action="append", metavar="NAME:TYPE",
                   help=f"a user column (repeat); types: {', '.join(TYPES)}; add '!' for a required column")
    q.add_argument("--buckets", type=int, default=1)
    q.add_argument("--kafka-format", choices=["json", "avro"], default=None,
                   help="how Kafka clients see the rows of a table with columns (default json)")
    q.add_argument("--config", action="append", metavar="NAME=VALUE")
    q.add_argument("--primary-key", metavar="A,B", help="primary-key columns: a table of the latest row per key")
    q.add_argument("--bucket-key", metavar="A", help="bucket-key columns (a prefix of the primary key)")
    q.add_argument("--merge-engine", choices=["last_row", "first_row", "versioned", "retract", "aggregation"],
                   help="how writes merge per key (docs/primary_keys.md): 'retract' materializes a changelog "
                   "that arrives reordered; 'aggregation' folds rows with --agg functions")
    q.add_argument("--version-column", help="version column of merge engine 'versioned'")
    q.add_argument("--upsert-key", metavar="A,B", help="merge engine 'retract': the columns identifying a row "
                   "among a key's live rows (default all columns)")
    q.add_argument("--retract-state-ttl-ms", type=int, metavar="MS",
                   help="merge engine 'retract': drop hidden live rows older than this")
    q.add_argument("--agg", action="append", metavar="COLUMN=FUNCTION",
                   help="merge engine 'aggregation': a column's function (repeat): sum, min, max, count, "
                   "last_value, last_non_null_value, first_value, first_non_null_value, bool_and, bool_or, listagg")
    _url_arg(q)
    q.set_defaults(run=table_create)
    q = ts.add_parser("drop")
    q.add_argument("table")
    _url_arg(q)
    q.set_defaults(run=table_drop)
    q = ts.add_parser("compact", help="clean a table with cleanup.policy=compact now (latest record per key)")
    q.add_argument("table")
    _url_arg(q)
    q.set_defaults(run=table_compact)
    from fluvial.broker.table_copy import add_parsers
    add_parsers(ts, _url_arg)


# ---- scan -------------------------------------------------------------------

def _limited(batches: Iterable[pa.RecordBatch], limit: int | None) -> Iterable[pa.RecordBatch]:
    seen = 0
    for batch in batches:
        if limit is not None and seen + batch.num_rows >= limit:
            yield batch.slice(0, limit - seen)
            return
        seen += batch.num_rows
        yield batch


def scan(args) -> int:
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    filters = [parse_where(w) for w in args.where or []]
    start: Any = int(args.start) if args.start.lstrip("-").isdigit() else args.start
    buckets = [int(b) for b in args.buckets.split(",")] if args.buckets else None
    limit = None if args.follow and args.limit is None else (args.limit if args.limit is not None else 20)
    try:
        with _connect(args) as client:
            s = client.table(args.table).scan(columns=columns, filter=filters, start=start, buckets=buckets)
            if args.follow:
                header = True
                stream = s.follow()
                try:
                    for batch in _limited(stream, limit):
                        text = format_rows(pa.Table.from_batches([batch]))
                        print(text if header else text.split("\n", 2)[2], flush=True)
                        header = False
                finally:
                    stream.close()
                return 0
            stream = s.to_batches()
            try:
                batches = list(_limited(stream, limit))
            finally:
                stream.close()
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # noqa: BLE001
        return _fail(exc)
    rows = pa.Table.from_batches(batches, schema=s.schema) if batches else None
    if rows is None or rows.num_rows == 0:
        print("(no rows)")
    else:
        print(format_rows(rows))
        print(f"({rows.num_rows} row{'s' if rows.num_rows != 1 else ''})")
    return 0


@subcommand
def register_scan(sub) -> None:
    p = sub.add_parser("scan", help="print rows of a table, reading only the columns asked for")
    p.add_argument("table")
    p.add_argument("--columns", help="comma-separated columns (default all; system columns such as _offset "
                                     "when named)")
    p.add_argument("--where", action="append", metavar="'COLUMN OP VALUE'", help="a filter (repeat: AND)")
    p.add_argument("--start", default="earliest", help="earliest (default), latest or an offset")
    p.add_argument("--buckets", help="comma-separated buckets (default all)")
    p.add_argument("--limit", type=int, default=None, help="at most this many rows (default 20; following: none)")
    p.add_argument("--follow", action="store_true", help="keep printing rows as they are appended")
    _url_arg(p)
    p.set_defaults(run=scan)
