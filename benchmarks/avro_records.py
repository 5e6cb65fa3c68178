"""The 20-field Avro schema of typed-table tests and benchmarks, and a record generator for it."""
from __future__ import annotations

import datetime as dt
import decimal
import io
import random
import uuid

import fastavro
import numpy as np

UTC = dt.timezone.utc

# Twenty fields covering every type the table mapping knows.
SCHEMA20 = {
    "type": "record", "name": "Order", "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "flag", "type": "boolean"},
        {"name": "count", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "score", "type": "double"},
        {"name": "name", "type": "string"},
        {"name": "payload", "type": "bytes"},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 8}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"},
            {"name": "zip", "type": ["null", "int"], "default": None},
        ]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
    ],
}


def make_record(rng: random.Random, i: int, pad: int = 0) -> dict:
    """Record `i` of SCHEMA20 (about 160 B serialized); `pad` widens it by about that many
    bytes, split between the `name` string and the `payload` bytes."""
    record = {
        "id": rng.randint(-2 ** 63, 2 ** 63 - 1),
        "flag": rng.random() < 0.5,
        "count": rng.randint(-2 ** 31, 2 ** 31 - 1),
        "ratio": float(np.float32(rng.uniform(-1e6, 1e6))),
        "score": rng.uniform(-1e12, 1e12),
        "name": "".join(rng.choice("abcdé漢🙂") for _ in range(rng.randint(0, 12))),
        "payload": rng.randbytes(rng.randint(0, 16)),
        "status": rng.choice(["NEW", "PAID", "SHIPPED"]),
        "digest": rng.randbytes(8),
        "amount": decimal.Decimal(rng.randint(-10 ** 11, 10 ** 11)).scaleb(-2),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=rng.randint(-20000, 40000)),
        "t_ms": dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.randint(0, 999) * 1000),
        "t_us": dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59), rng.randint(0, 999999)),
        "ts_ms": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=rng.randint(-10 ** 12, 10 ** 12)),
        "ts_us": dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=rng.randint(-10 ** 15, 10 ** 15)),
        "uid": str(uuid.UUID(int=rng.getrandbits(128))),
        "note": None if i % 3 == 0 else f"note {i}",
        "address": {"street": f"{i} Main St", "zip": None if i % 4 == 0 else rng.randint(0, 99999)},
        "tags": [f"t{j}" for j in range(rng.randint(0, 4))],
        "attrs": {f"k{j}": rng.randint(-1000, 10 ** 10) for j in range(rng.randint(0, 3))},
    }
    if pad > 0:
        record["name"] += "x" * (pad // 2)
        record["payload"] += rng.randbytes(pad - pad // 2)
    return record


def confluent_wire(schema: dict, schema_id: int, records: list[dict]) -> list[bytes]:
    """Records in Confluent's wire format (magic 0, 4-byte schema id, Avro binary), as
    confluent-kafka's AvroSerializer writes them (it encodes with fastavro)."""
    parsed = fastavro.parse_schema(schema)
    out = []
    for r in records:
        buf = io.BytesIO()
        buf.write(b"\0" + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(buf, parsed, r)
        out.append(buf.getvalue())
    return out
