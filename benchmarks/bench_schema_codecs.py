"""Records/s of the typed-table value codec against per-record fastavro, 20-field Avro values.

Decode = Kafka values (Confluent wire format) -> typed Arrow columns; encode = columns ->
values byte-identical to the produced ones. The peers do the same work one record at a
time with fastavro (`schemaless_reader` + `pa.Table.from_pylist`, `to_pylist` +
`schemaless_writer`); polars' columnar Avro reader (values framed as one container block)
is measured for decode as the other columnar candidate. Median of 3 runs, one core.
Saves benchmarks/results/schema_codecs.json.

    python -m benchmarks.bench_schema_codecs [--records 20000] [--batch 1000]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.codecs import value_codec
from fluvial.schema.registry import SchemaRegistry, parse_schema
from benchmarks.avro_records import SCHEMA20, confluent_wire, make_record

RESULTS = Path(__file__).parent / "results" / "schema_codecs.json"


def median_rate(fn, records: int, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return records / statistics.median(times)


def container_block(schema: dict, bodies: list[bytes]) -> bytes:
    """Values framed as one Avro object container file with a single block."""
    head = io.BytesIO()
    fastavro.writer(head, fastavro.parse_schema(schema), [], codec="null")
    header = head.getvalue()
    sync = header[-16:]

    def varlong(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = bytearray()
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)

    body = b"".join(bodies)
    return header + varlong(len(bodies)) + varlong(len(body)) + body + sync


def run_size(label: str, records: list[dict], batch: int, registry: SchemaRegistry, sid: int) -> dict:
    parsed = fastavro.parse_schema(SCHEMA20)
    values = confluent_wire(SCHEMA20, sid, records)
    n = len(values)
    batches = [pa.array(values[i:i + batch], pa.binary()) for i in range(0, n, batch)]
    codec = value_codec(registry, "bench")
    decoded = [codec.decode(b) for b in batches]
    assert all(codec.encode(c, ids).equals(b) for (c, ids), b in zip(decoded, batches))

    def ours_decode():
        for b in batches:
            codec.decode(b)

    def ours_encode():
        for c, ids in decoded:
            codec.encode(c, ids)

    py_batches = [b.to_pylist() for b in batches]

    def fastavro_decode():
        for vals in py_batches:
            rows = [fastavro.schemaless_reader(io.BytesIO(v[5:]), parsed) for v in vals]
            for row in rows:  # fastavro gives uuid.UUID; the column holds the text
                row["uid"] = str(row["uid"])
            pa.Table.from_pylist(rows, schema=codec.table_schema)

    def fastavro_encode():
        for c, ids in decoded:
            out = []
            for row, i in zip(c.to_pylist(), ids.tolist()):
                buf = io.BytesIO()
                buf.write(b"\0" + int(i).to_bytes(4, "big"))
                row["attrs"] = dict(row["attrs"])
                fastavro.schemaless_writer(buf, parsed, row)
                out.append(buf.getvalue())
            pa.array(out, pa.binary())

    result = {
        "value_bytes_avg": round(sum(map(len, values)) / n, 1),
        "records": n,
        "batch": batch,
        "fluvial_decode_rps": round(median_rate(ours_decode, n)),
        "fluvial_encode_rps": round(median_rate(ours_encode, n)),
        "fastavro_per_record_decode_to_arrow_rps": round(median_rate(fastavro_decode, n, runs=1)),
        "fastavro_per_record_encode_from_arrow_rps": round(median_rate(fastavro_encode, n, runs=1)),
    }
    try:
        import polars as pl
        containers = [container_block(SCHEMA20, [v[5:] for v in vals]) for vals in py_batches]

        def polars_decode():
            for blob in containers:
                pl.read_avro(io.BytesIO(blob)).to_arrow()

        polars_decode()
        result["polars_read_avro_container_decode_rps"] = round(median_rate(polars_decode, n))
    except BaseException as exc:  # polars' Avro reader panics on types it lacks (maps)
        if isinstance(exc, KeyboardInterrupt):
            raise
        result["polars_read_avro_container_decode_rps"] = f"unsupported: {type(exc).__name__}: {str(exc)[:120]}"
    result["decode_speedup_vs_fastavro"] = round(result["fluvial_decode_rps"] / result["fastavro_per_record_decode_to_arrow_rps"], 1)
    result["encode_speedup_vs_fastavro"] = round(result["fluvial_encode_rps"] / result["fastavro_per_record_encode_from_arrow_rps"], 1)
    print(f"{label}: " + json.dumps(result, indent=1))
    return result


def run_without_maps(records: list[dict], batch: int, registry: SchemaRegistry) -> dict:
    """Decode against polars' columnar Avro reader on the schema minus its map field
    (polars cannot read maps); polars gives other types and does no validation."""
    import polars as pl
    schema = {**SCHEMA20, "name": "NoMap", "fields": [f for f in SCHEMA20["fields"] if f["name"] != "attrs"]}
    sid = registry.register("nomap-value", parse_schema(json.dumps(schema)))[0]
    parsed = fastavro.parse_schema(schema)
    bodies = []
    for r in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {k: v for k, v in r.items() if k != "attrs"})
        bodies.append(buf.getvalue())
    header = b"\0" + sid.to_bytes(4, "big")
    batches = [pa.array([header + b for b in bodies[i:i + batch]], pa.binary()) for i in range(0, len(bodies), batch)]
    framed = [container_block(schema, bodies[i:i + batch]) for i in range(0, len(bodies), batch)]
    codec = value_codec(registry, "nomap")

    def ours():
        for b in batches:
            codec.decode(b)

    def polars_only_read():  # the container framing is not counted
        for blob in framed:
            pl.read_avro(io.BytesIO(blob)).to_arrow()

    result = {"fluvial_decode_rps": round(median_rate(ours, len(bodies))),
              "polars_read_avro_decode_rps": round(median_rate(polars_only_read, len(bodies)))}
    print("19 fields, no map: " + json.dumps(result))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        registry = SchemaRegistry(MetadataStore(os.path.join(tmp, "meta.db")))
        sid = registry.register("bench-value", parse_schema(json.dumps(SCHEMA20)))[0]
        rng = random.Random(1)
        small = [make_record(rng, i) for i in range(args.records)]
        large = [{**r, "payload": rng.randbytes(760)} for r in small]
        out = {
            "what": "records/s of Avro values <-> typed Arrow columns, 20 fields, one core",
            "about_200_bytes": run_size("~200 B", small, args.batch, registry, sid),
            "about_1_kb": run_size("~1 KB", large, args.batch, registry, sid),
            "about_200_bytes_without_map_field": run_without_maps(small, args.batch, registry),
            "python": f"{os.sys.version_info.major}.{os.sys.version_info.minor}",
            "pyarrow": pa.__version__,
            "numpy": np.__version__,
            "fastavro": fastavro.__version__,
        }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"saved {RESULTS}")


if __name__ == "__main__":
    main()
