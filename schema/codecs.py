"""Value codecs of typed tables: Kafka record values <-> typed Arrow columns, whole batches at a time.

Produce path: `decode(values)` turns the values of one record batch into a struct column in
the table's schema plus each record's schema id, or refuses the whole batch with
InvalidRecordError and one message per bad record. Fetch path: `encode(columns, schema_ids)`
gives the values back (Avro byte-identical, each record with its own writer schema).
"""
from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from typing import Protocol

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from fluvial.errors import InvalidRecordError
from fluvial.schema.arrow_mapping import arrow_to_json_schema
from fluvial.schema.base64_text import b64decode, b64encode
from fluvial.schema.avro_binary import DecodeErrors, binary_from_buffers, decode_avro, decode_framed, encode_avro, pad
from fluvial.schema.compatibility import arrow_can_evolve
from fluvial.schema.errors import SchemaNotFoundError, UnsupportedSchemaError
from fluvial.schema.evolution import evolve_array
from fluvial.schema.registry import Schema, SchemaRegistry, SchemaType

log = logging.getLogger(__name__)

MAGIC = 0
HEADER_SIZE = 5
NO_SCHEMA_ID = 0  # a plain JSON value, sent without the wire-format header


class ValueCodec(Protocol):
    table_schema: pa.Schema

    def decode(self, values: pa.Array) -> tuple[pa.StructArray, np.ndarray]: ...

    def encode(self, columns: pa.StructArray | pa.RecordBatch, schema_ids: np.ndarray) -> pa.BinaryArray: ...


def value_codec(registry: SchemaRegistry, topic: str, table_schema: pa.Schema | None = None) -> ValueCodec:
    """The codec of a typed table whose value schemas live under `<topic>-value`."""
    subject = f"{topic}-value"
    latest = registry.latest(subject)
    if latest is None:
        raise SchemaNotFoundError(f"Subject '{subject}' has no schema")
    if latest[1].schema_type is SchemaType.AVRO:
        return AvroValueCodec(registry, subject, table_schema)
    return JsonValueCodec(registry, subject, table_schema)


@dataclass
class _Values:
    """The buffers of a binary column, with offsets as int64 positions into a padded buffer."""

    n: int
    start: np.ndarray
    end: np.ndarray
    data: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, values: pa.Array, padded: bool = True) -> "_Values":
        """`padded=False`: the data buffer as Arrow holds it (no copy), for readers bounded
        by each value's end (the Avro decoder pads for its reference path itself)."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type):
            values = values.cast(pa.binary())
        elif not pa.types.is_binary(values.type):
            values = values.cast(pa.binary())
        n = len(values)
        _, obuf, dbuf = values.buffers()
        offsets = np.frombuffer(obuf, np.int32, n + 1, values.offset * 4).astype(np.int64)
        data = np.frombuffer(dbuf, np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
        if padded:
            data = pad(data)
        valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else np.ones(n, bool)
        return cls(n, offsets[:-1], offsets[1:], data, valid)

    def header_ids(self, errors: DecodeErrors, required: bool) -> tuple[np.ndarray, np.ndarray]:
        """(schema id per record, mask of records carrying the wire-format header)."""
        length = self.end - self.start
        # The first 5 bytes of each value (clipped to the buffer: those of a value shorter
        # than the header are never used).
        data = self.data if self.data.size else np.zeros(1, np.uint8)
        head = data[np.minimum(self.start[:, None] + np.arange(5), data.size - 1)]
        first = head[:, 0]
        has = self.valid & (length >= HEADER_SIZE) & (first == MAGIC)
        if required:
            short = self.valid & (length < HEADER_SIZE)
            errors.add(np.flatnonzero(short), "value is shorter than the wire-format header "
                                              "(magic byte 0 and a 4-byte schema id)")
            errors.add(np.flatnonzero(self.valid & ~short & (first != MAGIC)),
                       "value does not start with magic byte 0 (Confluent wire format)")
        b = head[:, 1:].astype(np.int64)
        ids = (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]
        ids = np.where(has, ids, NO_SCHEMA_ID)
        return ids.astype(np.int64), has


def _raise(errors: DecodeErrors, n: int) -> None:
    problems = errors.by_record()
    if problems:
        i, first = problems[0]
        raise InvalidRecordError(
            f"{len(problems)} of {n} records do not match the table schema; record {i}: {first}",
            record_errors=problems)


def _restore_order(parts: list[pa.Array], rows: list[np.ndarray], n: int) -> pa.Array:
    """Concatenate per-group results and put each row back at its index."""
    if len(parts) == 1 and rows[0].size == n:
        return parts[0]
    perm = np.empty(n, np.int64)
    perm[np.concatenate(rows)] = np.arange(n)
    return pa.concat_arrays(parts).take(pa.array(perm))


def _prefix(body: pa.Array, schema_id: int) -> pa.Array:
    header = pa.scalar(bytes([MAGIC]) + int(schema_id).to_bytes(4, "big"), pa.binary())
    return pc.binary_join_element_wise(header, body, pa.scalar(b"", pa.binary()))


def _struct_of(columns: pa.StructArray | pa.RecordBatch | pa.Table) -> pa.StructArray:
    if isinstance(columns, pa.Table):
        columns = columns.combine_chunks().to_batches()[0] if columns.num_rows else pa.RecordBatch.from_pylist([], columns.schema)
    if isinstance(columns, pa.RecordBatch):
        return pa.StructArray.from_arrays(columns.columns, fields=list(columns.schema))
    if isinstance(columns, pa.ChunkedArray):
        return columns.combine_chunks()
    return columns


class _SubjectCodec:
    """What both formats share: the subject, the table schema and which writer ids it accepts."""

    schema_type: SchemaType

    def __init__(self, registry: SchemaRegistry, subject: str, table_schema: pa.Schema | None = None):
        self.registry = registry
        self.subject = subject
        self._pinned = table_schema
        self._generation = -1
        self._table_schema: pa.Schema | None = None
        self._accepted: dict[int, str | None] = {}
        self._refresh()

    def _refresh(self) -> None:
        if self._generation == self.registry.generation:
            return
        self._generation = self.registry.generation
        self._accepted = {}
        self._ids = set(self.registry.subject_ids(self.subject))
        if self._pinned is not None:
            self._table_schema = self._pinned
        else:
            self._table_schema = self._newest_table_schema()

    def _newest_table_schema(self) -> pa.Schema:
        """The columns of the newest version that has a column mapping: a version without
        one (registered where no table validator guards the subject) does not break the
        table, its records are refused instead."""
        versions = self.registry.store.versions(self.subject)
        if not versions:
            raise SchemaNotFoundError(f"Subject '{self.subject}' has no schema")
        for v in reversed(versions):
            schema = self.registry.schema(v.schema_id)
            if schema.schema_type is not self.schema_type:
                continue
            try:
                return schema.arrow_schema
            except UnsupportedSchemaError:
                log.warning("subject %s version %d has no column mapping; the table keeps its columns",
                            self.subject, v.version)
        raise UnsupportedSchemaError(f"no version of subject '{self.subject}' maps to table columns")

    @property
    def table_schema(self) -> pa.Schema:
        """The Arrow schema of the user columns that `decode` returns."""
        self._refresh()
        return self._table_schema

    @property
    def table_type(self) -> pa.StructType:
        schema = self.table_schema
        cached = getattr(self, "_table_type", None)
        if cached is None or cached[0] is not schema:  # built once per table schema, not per batch
            cached = self._table_type = (schema, pa.struct(list(schema)))
        return cached[1]

    def refusal(self, schema_id: int) -> str | None:
        """Why records written with this schema id are refused (None = accepted)."""
        self._refresh()
        if schema_id in self._accepted:
            return self._accepted[schema_id]
        why = self._check(schema_id)
        self._accepted[schema_id] = why
        return why

    def _check(self, schema_id: int) -> str | None:
        try:
            writer = self.registry.schema(schema_id)
        except SchemaNotFoundError:
            return f"schema id {schema_id} is not registered"
        if schema_id not in self._ids:
            return f"schema id {schema_id} is not a version of subject {self.subject!r}"
        if writer.schema_type is not self.schema_type:
            return f"schema id {schema_id} is a {writer.schema_type.value} schema, the table holds {self.schema_type.value}"
        try:
            cols = writer.arrow_schema
        except UnsupportedSchemaError as exc:
            return f"schema id {schema_id} has no column mapping: {exc}"
        problems = arrow_can_evolve(cols, self._table_schema)
        lost = _lost_fields(cols, self._table_schema)
        if lost:
            problems.append(f"writer fields {lost} are not columns of the table")
        if problems:
            return f"schema id {schema_id} is not compatible with the table schema: {'; '.join(problems)}"
        return None

    def _writer(self, schema_id: int) -> Schema:
        return self.registry.schema(schema_id)


def _lost_fields(writer: pa.Schema | pa.StructType, table: pa.Schema | pa.StructType, path: str = "") -> list[str]:
    """Writer fields with no column in the table: their values could not be re-encoded."""
    have = {f.name: f for f in table}
    out = []
    for f in writer:
        p = f"{path}.{f.name}" if path else f.name
        if f.name not in have:
            out.append(p)
        elif pa.types.is_struct(f.type) and pa.types.is_struct(have[f.name].type):
            out += _lost_fields(f.type, have[f.name].type, p)
        elif pa.types.is_list(f.type) and pa.types.is_list(have[f.name].type) and pa.types.is_struct(f.type.value_type) \
                and pa.types.is_struct(have[f.name].type.value_type):
            out += _lost_fields(f.type.value_type, have[f.name].type.value_type, p + "[]")
    return out


class AvroValueCodec(_SubjectCodec):
    """Avro values in the Confluent wire format: magic 0, 4-byte schema id, Avro binary."""

    schema_type = SchemaType.AVRO

    def decode(self, values: pa.Array) -> tuple[pa.StructArray, np.ndarray]:
        uniform = self._decode_uniform(values)
        if uniform is not None:
            return uniform
        v = _Values.of(values, padded=False)
        errors = DecodeErrors(np.full(v.n, -1, np.int64))
        errors.add(np.flatnonzero(~v.valid), "record has no value (null); the table needs one")
        ids, has = v.header_ids(errors, required=True)
        parts, rows = [], []
        table_field = pa.field("value", self.table_type, False)
        for schema_id in np.unique(ids[has]):
            group = np.flatnonzero(has & (ids == schema_id))
            why = self.refusal(int(schema_id))
            if why is not None:
                errors.add(group, why)
                continue
            arr = decode_avro(self._writer(int(schema_id)).avro.root, v.data,
                              v.start[group] + HEADER_SIZE, v.end[group], group, errors)
            parts.append(evolve_array(arr, table_field))
            rows.append(group)
        _raise(errors, v.n)
        if not parts:
            return pa.array([], self.table_type), np.zeros(0, np.int32)
        return _restore_order(parts, rows, v.n), ids.astype(np.int32)

    def _decode_uniform(self, values: pa.Array) -> tuple[pa.StructArray, np.ndarray] | None:
        """The usual batch, every value framed with the same writer schema id: the schema
        id read from the first value, then one compiled pass that checks each value's header
        and decodes it (no NumPy steps per batch). None when the batch is anything else or
        has a problem: the general path then decodes it and names each record's problem."""
        if not isinstance(values, pa.BinaryArray) or not len(values) or values.null_count:
            return None
        head = values[0].as_buffer()
        if head is None or head.size < HEADER_SIZE or head[0] != MAGIC:
            return None
        schema_id = int.from_bytes(head[1:HEADER_SIZE], "big")
        if self.refusal(schema_id) is not None:
            return None
        arr = decode_framed(self._writer(schema_id).avro.root, values, schema_id)
        if arr is None:
            return None
        return evolve_array(arr, pa.field("value", self.table_type, False)), np.full(len(values), schema_id, np.int32)

    def encode(self, columns: pa.StructArray | pa.RecordBatch, schema_ids: np.ndarray) -> pa.BinaryArray:
        cols = _struct_of(columns)
        ids = np.asarray(schema_ids)
        n = len(cols)
        uniq = np.unique(ids)
        parts, rows = [], []
        for schema_id in uniq:
            group = np.arange(n) if uniq.size == 1 else np.flatnonzero(ids == schema_id)
            sub = cols if uniq.size == 1 else cols.take(pa.array(group))
            header = bytes([MAGIC]) + int(schema_id).to_bytes(4, "big")
            parts.append(encode_avro(self._writer(int(schema_id)).avro.root, sub, prefix=header))
            rows.append(group)
        out = _restore_order(parts, rows, n) if parts else pa.array([], pa.binary())
        if cols.null_count:
            out = pc.if_else(cols.is_null(), pa.scalar(None, pa.binary()), out)
        return out


class JsonValueCodec(_SubjectCodec):
    """JSON values: plain JSON objects, or JSON Schema wire format (magic 0, schema id, JSON text)."""

    schema_type = SchemaType.JSON

    def _refresh(self) -> None:
        gen = self._generation
        super()._refresh()
        if gen != self._generation:
            self._read_schema = pa.schema([_json_read_field(f) for f in self._table_schema])
            self._validator = jsonschema.Draft202012Validator(arrow_to_json_schema(self._table_schema))

    def decode(self, values: pa.Array) -> tuple[pa.StructArray, np.ndarray]:
        self._refresh()
        v = _Values.of(values)
        errors = DecodeErrors(np.full(v.n, -1, np.int64))
        errors.add(np.flatnonzero(~v.valid), "record has no value (null); the table needs one")
        ids, has = v.header_ids(errors, required=False)
        for schema_id in np.unique(ids[has]):
            why = self.refusal(int(schema_id))
            if why is not None:
                errors.add(np.flatnonzero(has & (ids == schema_id)), why)
        start = np.where(has, v.start + HEADER_SIZE, v.start)
        length = np.where(v.valid, v.end - start, 0)
        empty = v.valid & (length == 0)
        errors.add(np.flatnonzero(empty), "value is empty, not a JSON object")
        if errors.by_record():
            self._find_json_errors(v, start, length, errors)
            _raise(errors, v.n)
        data, start, length = self._without_line_breaks(v, start, length, errors)
        if errors.by_record():
            self._find_json_errors(v, start, length, errors, data)
            _raise(errors, v.n)
        lines = _json_lines(data, start, length)
        table = None
        try:
            table = pa_json.read_json(
                io.BytesIO(lines),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(lines), 1 << 16) + 1),
                parse_options=pa_json.ParseOptions(explicit_schema=self._read_schema,
                                                   unexpected_field_behavior="error"))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
            table = None
        if table is None or table.num_rows != v.n:
            self._find_json_errors(v, start, length, errors, data)
            if not errors.by_record():
                self._find_unreadable(data, start, length, errors)
            _raise(errors, v.n)
            raise InvalidRecordError("the batch's JSON values could not be read as the table's columns",
                                     record_errors=[(i, "value could not be read as the table's columns")
                                                    for i in range(v.n)])
        cols = pa.StructArray.from_arrays([c.combine_chunks() for c in table.columns], fields=list(self._read_schema))
        cols = self._to_table_types(cols, errors)
        self._check_required(cols, errors)
        if errors.by_record():
            self._find_json_errors(v, start, length, errors, data)
        _raise(errors, v.n)
        return cols, ids.astype(np.int32)

    def _to_table_types(self, cols: pa.StructArray, errors: DecodeErrors) -> pa.StructArray:
        return _cast_json(cols, pa.field("value", self.table_type, False), errors, np.arange(len(cols)), "")

    def _check_required(self, cols: pa.StructArray, errors: DecodeErrors) -> None:
        _required(cols, self.table_type, np.ones(len(cols), bool), errors, "")

    def _find_json_errors(self, v: _Values, start: np.ndarray, length: np.ndarray, errors: DecodeErrors,
                          data: np.ndarray | None = None) -> None:
        # Error path only: one record at a time, to name each bad record's problem.
        for i in range(v.n):
            if errors.first[i] >= 0 or not v.valid[i]:
                continue
            raw = (v.data if data is None else data)[start[i]:start[i] + length[i]].tobytes()
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                errors.add(np.array([i]), f"value is not valid JSON: {exc}")
                continue
            if not isinstance(doc, dict):
                errors.add(np.array([i]), f"value is JSON {type(doc).__name__}, not an object")
                continue
            err = jsonschema.exceptions.best_match(self._validator.iter_errors(doc))
            if err is not None:
                where = ".".join(str(p) for p in err.absolute_path)
                errors.add(np.array([i]), f"field {where!r}: {err.message}" if where else err.message)

    @staticmethod
    def _without_line_breaks(v: _Values, start: np.ndarray, length: np.ndarray, errors: DecodeErrors
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Values holding raw line breaks (pretty-printed JSON) rewritten compact, so that
        every value is one line for the columnar reader; those are the only values parsed
        one at a time. A line break inside a string is invalid JSON and is refused."""
        breaks = np.flatnonzero((v.data == 10) | (v.data == 13))
        if not breaks.size:
            return v.data, start, length
        order = np.argsort(start, kind="stable")
        owner = order[np.maximum(np.searchsorted(start[order], breaks, side="right") - 1, 0)]
        inside = (breaks >= start[owner]) & (breaks < start[owner] + length[owner]) & v.valid[owner]
        rows = np.unique(owner[inside])
        if not rows.size:
            return v.data, start, length
        extra, start, length = [], start.copy(), length.copy()
        at = v.data.size
        for i in rows.tolist():
            try:
                doc = json.loads(v.data[start[i]:start[i] + length[i]].tobytes())
            except ValueError as exc:
                errors.add(np.array([i]), f"value is not valid JSON: {exc}")
                length[i] = 0
                continue
            compact = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
            extra.append(compact)
            start[i], length[i] = at, len(compact)
            at += len(compact)
        return pad(np.concatenate([v.data, np.frombuffer(b"".join(extra), np.uint8)])), start, length

    def _find_unreadable(self, data: np.ndarray, start: np.ndarray, length: np.ndarray, errors: DecodeErrors) -> None:
        # Error path only: values valid for the JSON Schema that the column reader still
        # refuses (e.g. 1.0 in an integer column); read each one alone to name it.
        for i in range(start.size):
            line = _json_lines(data, start[i:i + 1], length[i:i + 1])
            try:
                pa_json.read_json(io.BytesIO(line), parse_options=pa_json.ParseOptions(
                    explicit_schema=self._read_schema, unexpected_field_behavior="error"))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                errors.add(np.array([i]), f"value cannot be read as the table's columns: {exc}")

    def encode(self, columns: pa.StructArray | pa.RecordBatch, schema_ids: np.ndarray) -> pa.BinaryArray:
        cols = _struct_of(columns)
        n = len(cols)
        if n == 0:
            return pa.array([], pa.binary())
        flat = cols.flatten()
        if _has_timestamp(cols.type):
            flat = [_as_json_texts(c) for c in flat]
        table = pa.Table.from_arrays(flat, names=[f.name for f in cols.type])
        # Imported on first use: polars costs about 0.3 s of every broker start otherwise.
        import polars as pl

        text = pl.from_arrow(table).write_ndjson().encode()
        data = np.frombuffer(text, np.uint8)
        ends = np.flatnonzero(data == 10)
        offsets = np.zeros(n + 1, np.int32)
        offsets[1:] = ends + 1
        # Each line keeps its newline; drop it by building values over [start, end - 1).
        lengths = np.diff(offsets) - 1
        body_idx = np.repeat(offsets[:-1] - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
        body = binary_from_buffers(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32), data[body_idx])
        ids = np.asarray(schema_ids)
        framed = ids != NO_SCHEMA_ID
        if framed.any():
            parts, rows = [], []
            plain = np.flatnonzero(~framed)
            if plain.size:
                parts.append(body.take(pa.array(plain)))
                rows.append(plain)
            for schema_id in np.unique(ids[framed]):
                group = np.flatnonzero(ids == schema_id)
                parts.append(_prefix(body.take(pa.array(group)), int(schema_id)))
                rows.append(group)
            body = _restore_order(parts, rows, n)
        if cols.null_count:
            body = pc.if_else(cols.is_null(), pa.scalar(None, pa.binary()), body)
        return body


def _json_lines(data: np.ndarray, start: np.ndarray, length: np.ndarray) -> bytes:
    """All values as JSON lines (none holds a raw line break)."""
    out_off = np.zeros(start.size + 1, np.int64)
    np.cumsum(length + 1, out=out_off[1:])
    total = int(out_off[-1])
    idx = np.repeat(start - out_off[:-1], length + 1) + np.arange(total)
    out = data[idx]
    out[out_off[1:] - 1] = 10
    return out.tobytes()


def _json_read_field(f: pa.Field) -> pa.Field:
    """The type the JSON reader produces for a column (dates and date-times are read as
    text, then cast)."""
    t = f.type
    if pa.types.is_date32(t) or pa.types.is_timestamp(t) or pa.types.is_time(t) or _is_bytes(t):
        return pa.field(f.name, pa.string(), True)
    if pa.types.is_struct(t):
        return pa.field(f.name, pa.struct([_json_read_field(c) for c in t]), True)
    if pa.types.is_list(t):
        return pa.field(f.name, pa.list_(_json_read_field(t.value_field)), True)
    if pa.types.is_map(t):
        raise UnsupportedSchemaError(f"column {f.name!r}: JSON objects with free keys (maps) are not supported by the JSON codec")
    return pa.field(f.name, t, True)


def _is_bytes(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _contains(t: pa.DataType, leaf) -> bool:
    """Whether `leaf(type)` holds for `t` or any type nested in its structs and lists."""
    if leaf(t):
        return True
    if pa.types.is_struct(t):
        return any(_contains(f.type, leaf) for f in t)
    return pa.types.is_list(t) and _contains(t.value_type, leaf)


def _has_date(t: pa.DataType) -> bool:
    return _contains(t, lambda x: pa.types.is_date32(x) or pa.types.is_timestamp(x) or pa.types.is_time(x)
                     or _is_bytes(x))


def _cast_json(arr: pa.Array, f: pa.Field, errors: DecodeErrors, rows: np.ndarray, path: str) -> pa.Array:
    """The reader's columns in the table's types: date texts become dates (records with
    other texts are refused), struct and list types take the table's nullability."""
    t = f.type
    if _is_bytes(t):
        values, bad = b64decode(arr)
        if bad.any():
            what = f"field {path!r}: not base64 text (RFC 4648, padded)"
            errors.add(rows[bad] if rows.size == len(arr) else np.arange(errors.first.size), what)
        return values.cast(t)
    if pa.types.is_time(t):
        try:
            return _time_of_day(arr, t)
        except pa.ArrowInvalid:
            what = f"field {path!r}: not a time of day of {t} (HH:MM:SS, at most {_UNIT_DIGITS[t.unit]} fraction digits)"
            if rows.size == len(arr):
                ok = np.array([v is None or _time_parses(v, t) for v in arr.to_pylist()], bool)  # error path only
                errors.add(rows[~ok], what)
            else:
                errors.add(np.arange(errors.first.size), what)
            return pa.nulls(len(arr), t)
    if pa.types.is_timestamp(t):
        try:
            return pc.cast(arr, t)
        except pa.ArrowInvalid:
            form = ("RFC 3339 with an offset, e.g. 2026-01-31T12:00:00.250Z" if t.tz else
                    "without an offset, e.g. 2026-01-31T12:00:00.250")
            what = f"field {path!r}: not a date-time of {t} ({form}, at most {_UNIT_DIGITS[t.unit]} fraction digits)"
            if rows.size == len(arr):
                ok = _parses(arr, t)
                errors.add(rows[~ok], what)
            else:
                errors.add(np.arange(errors.first.size), what)
            return pa.nulls(len(arr), t)
    if pa.types.is_date32(t):
        try:
            return pc.cast(arr, pa.date32())
        except pa.ArrowInvalid:
            if rows.size == len(arr):
                ok = _date_texts(arr)
                errors.add(rows[~ok], f"field {path!r}: not a date (YYYY-MM-DD)")
            else:  # dates inside lists: name every record of the batch
                errors.add(np.arange(errors.first.size), f"field {path!r}: not a date (YYYY-MM-DD)")
            return pa.nulls(len(arr), pa.date32())
    if pa.types.is_struct(t):
        children = [
            _cast_json(arr.field(i), t.field(i), errors, rows, f"{path}.{t.field(i).name}" if path else t.field(i).name)
            for i in range(t.num_fields)
        ]
        return pa.StructArray.from_arrays(children, fields=list(t), mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(t) and _has_date(t.value_type):
        values = _cast_json(arr.flatten(), t.value_field, errors, np.zeros(0, np.int64), f"{path}[]")
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        return pa.ListArray.from_arrays(offsets, values, type=t, mask=arr.is_null() if arr.null_count else None)
    return arr if arr.type == t else arr.cast(t)


_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _parses(arr: pa.Array, t: pa.DataType) -> np.ndarray:
    """Which texts parse as `t` (nulls count as fine: the required check names them)."""
    ok = np.ones(len(arr), bool)
    for i, text in enumerate(arr.to_pylist()):  # error path only
        if text is not None:
            try:
                pc.cast(pa.array([text]), t)
            except pa.ArrowInvalid:
                ok[i] = False
    return ok


def _time_of_day(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """`HH:MM:SS[.fff]` texts as a time column (parsed as a time on 1970-01-01)."""
    stamps = pc.cast(pc.binary_join_element_wise("1970-01-01T", arr, ""), pa.timestamp(t.unit))
    return pc.cast(stamps, t)


def _time_parses(text: str, t: pa.DataType) -> bool:
    try:
        _time_of_day(pa.array([text]), t)
        return True
    except pa.ArrowInvalid:
        return False


def _as_json_texts(arr: pa.Array) -> pa.Array:
    """Columns JSON carries differently (also inside structs and lists): date-times as RFC
    3339 texts (UTC with `Z` for zoned timestamps, no offset for local ones), times as
    `HH:MM:SS[.fff]`, decimals (of up to 15 digits) as the float64 holding them exactly."""
    t = arr.type
    if _is_bytes(t):
        return b64encode(arr)
    if pa.types.is_time(t):
        return pc.cast(arr, pa.string())
    if pa.types.is_decimal(t):
        return pc.cast(arr, pa.float64())
    if pa.types.is_timestamp(t):
        if t.tz:
            return pc.strftime(arr.cast(pa.timestamp(t.unit, tz="UTC")), format="%Y-%m-%dT%H:%M:%SZ")
        return pc.strftime(arr, format="%Y-%m-%dT%H:%M:%S")
    if pa.types.is_struct(t) and _has_timestamp(t):
        children = [_as_json_texts(_struct_field(arr, i)) for i in range(t.num_fields)]
        fields = [pa.field(t.field(i).name, c.type, t.field(i).nullable) for i, c in enumerate(children)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(t) and _has_timestamp(t.value_type):
        values = _as_json_texts(arr.flatten())
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        return pa.ListArray.from_arrays(offsets, values, mask=arr.is_null() if arr.null_count else None)
    return arr


def _has_timestamp(t: pa.DataType) -> bool:
    """Whether a column holds values JSON carries differently (see `_as_json_texts`)."""
    return _contains(t, lambda x: pa.types.is_timestamp(x) or pa.types.is_time(x) or pa.types.is_decimal(x)
                     or _is_bytes(x))


def _struct_field(arr: pa.StructArray, i: int) -> pa.Array:
    child = arr.field(i)
    return child.slice(arr.offset, len(arr)) if len(child) != len(arr) else child


def _date_texts(arr: pa.Array) -> np.ndarray:
    """Which texts parse as dates (nulls count as fine: the required check names them)."""
    ok = np.ones(len(arr), bool)
    for i, text in enumerate(arr.to_pylist()):  # error path only
        if text is not None:
            try:
                pc.cast(pa.array([text]), pa.date32())
            except pa.ArrowInvalid:
                ok[i] = False
    return ok


def _required(arr: pa.Array, t: pa.DataType, present: np.ndarray, errors: DecodeErrors, path: str) -> None:
    """Refuse records where a non-nullable field is missing or null (top level and nested structs)."""
    for i in range(t.num_fields):
        f = t.field(i)
        child = arr.field(i)
        p = f"{path}.{f.name}" if path else f.name
        is_null = child.is_null().to_numpy(zero_copy_only=False)
        if not f.nullable:
            errors.add(np.flatnonzero(present & is_null), f"field {p!r}: required field is missing or null")
        if pa.types.is_struct(f.type):
            _required(child, f.type, present & ~is_null, errors, p)
        elif pa.types.is_list(f.type) and not f.type.value_field.nullable:
            flat_null = pc.is_null(child.flatten()).to_numpy(zero_copy_only=False)
            if flat_null.any():
                lengths = pc.list_value_length(child).fill_null(0).to_numpy(zero_copy_only=False)
                owner = np.repeat(np.arange(len(child)), lengths)
                errors.add(np.unique(owner[flat_null]), f"field {p!r}: array holds null items")
