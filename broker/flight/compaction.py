"""Table API action of log compaction: clean a compacted table now."""
from __future__ import annotations

import json

import pyarrow.flight as flight

from fluvial.errors import InvalidRequestError

COMPACT = "compact"

ACTIONS = {
    COMPACT: "Clean a table with cleanup.policy=compact now, up to its current end (the active segments are "
             "rolled first). Body: {table}. Returns each bucket's cleaning figures.",
}


def do_action(server, kind: str, body: dict) -> list[flight.Result] | None:
    """The action's results, or None when ``kind`` is not a compaction action."""
    if kind != COMPACT:
        return None
    name = body.get("table", body.get("name"))
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("the request names no table")
    manager = server.broker.extensions.get("log_cleaner")
    if manager is None:
        raise InvalidRequestError("the log cleaner is not running")
    result = server._on_loop(manager.compact_table, name)
    return [flight.Result(json.dumps(result).encode())]
