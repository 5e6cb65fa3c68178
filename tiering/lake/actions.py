"""The lake's Flight actions on the table API (bodies and results are JSON).

lake-info      {"name"}                      -> null (not a lake table) or {format, catalog, identifier,
                                                 snapshot_id, offsets, state, freshness_ms}
lake-acquire   {"job", "tables"?}            -> null (nothing due) or the work of one round
lake-heartbeat {"name", "lease_id"}          -> {"lease_ms"}  (LakeLeaseError when the lease is gone)
lake-complete  {"name", "lease_id", "snapshot_id", "offsets"} -> {"state", "snapshot_id"}
lake-fail      {"name", "lease_id", "error"} -> {"state"}
lake-status    {"name"?}                     -> [per lake table: state, snapshot, offsets, lag]
"""
from __future__ import annotations

import json

import pyarrow.flight as flight

from fluvial.errors import InvalidRequestError

LAKE_INFO = "lake-info"
LAKE_ACQUIRE = "lake-acquire"
LAKE_HEARTBEAT = "lake-heartbeat"
LAKE_COMPLETE = "lake-complete"
LAKE_FAIL = "lake-fail"
LAKE_STATUS = "lake-status"

ACTIONS = {
    LAKE_INFO: "Where a lake-enabled table's lake table is and what it covers. Body: {name}; null if not a lake table.",
    LAKE_ACQUIRE: "A tiering job asks for a round of work under a lease. Body: {job, tables?}; null if none is due.",
    LAKE_HEARTBEAT: "Extend a tiering lease. Body: {name, lease_id}.",
    LAKE_COMPLETE: "Report a committed tiering round. Body: {name, lease_id, snapshot_id, offsets}.",
    LAKE_FAIL: "Report a failed tiering round. Body: {name, lease_id, error}.",
    LAKE_STATUS: "Tiering state, lake snapshot, tiered offsets and lag of lake tables. Body: {name?}.",
}


def _text(body: dict, key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"the request has no {key!r}")
    return value


def do_action(server, kind: str, body: dict) -> list[flight.Result] | None:
    """The results of a lake action, None when `kind` is not one."""
    if kind not in ACTIONS:
        return None
    coordinator = server.broker.extensions.get("lake")
    if coordinator is None:
        raise InvalidRequestError("this broker runs no lake coordinator")
    if kind == LAKE_INFO:
        result = coordinator.info(body.get("name") or _text(body, "table"))
    elif kind == LAKE_ACQUIRE:
        tables = body.get("tables")
        result = coordinator.acquire(_text(body, "job"), list(tables) if tables else None)
    elif kind == LAKE_HEARTBEAT:
        result = coordinator.heartbeat(_text(body, "name"), _text(body, "lease_id"))
    elif kind == LAKE_COMPLETE:
        offsets = body.get("offsets")
        if not isinstance(offsets, dict):
            raise InvalidRequestError("the report has no offsets {bucket: end offset}")
        result = coordinator.complete(_text(body, "name"), _text(body, "lease_id"), body.get("snapshot_id"), offsets)
    elif kind == LAKE_FAIL:
        result = coordinator.fail(_text(body, "name"), _text(body, "lease_id"), str(body.get("error", "")))
    else:
        result = coordinator.status(body.get("name"))
    return [flight.Result(json.dumps(result).encode())]
