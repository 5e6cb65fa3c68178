"""Table API actions of internal tiering: where a bucket's remote segments are, and the status
of every bucket (local and remote offsets, bytes, segment counts)."""
from __future__ import annotations

import json
from typing import Any

import pyarrow.flight as flight

from fluvial.errors import InvalidRequestError

REMOTE_SEGMENTS = "remote-segments"
STATUS = "status"

ACTIONS = {
    REMOTE_SEGMENTS: "Remote segments of a bucket from an offset on, and where the store is (no secrets). "
                     "Body: {name, bucket, start}.",
    STATUS: "Local and remote offsets, bytes and segment counts of every bucket. Body: {name}.",
}


def _table_name(body: dict) -> str:
    name = body.get("name", body.get("table"))
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("the request names no table")
    return name


def _int(body: dict, key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{key!r} must be an integer, got {value!r}")
    return value


def remote_segments(broker, body: dict) -> dict:
    table = broker.tables.get(_table_name(body))
    # A changelog view of a primary-key table reads its table's log, remote part included.
    bucket = getattr(table.bucket(_int(body, "bucket")), "source", None) or table.bucket(_int(body, "bucket"))
    start = _int(body, "start", 0)
    manifest = broker.remote_log.manifest(bucket)
    return {
        "store": broker.object_store.public_description(),
        "segments": [s.to_json() for s in manifest.segments_from(start)],
        "log_start_offset": bucket.log_start_offset,
        "local_start_offset": bucket.tablet.log_start_offset,
    }


def do_action(server, kind: str, body: dict) -> list[flight.Result] | None:
    """The action's results, or None when ``kind`` is not a tiering action."""
    broker = server.broker
    result: Any
    if kind == REMOTE_SEGMENTS:
        result = remote_segments(broker, body)
    elif kind == STATUS:
        result = broker.remote_log.table_status(broker.tables.get(_table_name(body)))
    else:
        return None
    return [flight.Result(json.dumps(result).encode())]
