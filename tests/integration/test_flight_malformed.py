"""Malformed table API calls get INVALID_ARGUMENT-style errors with a clear message; the
broker logs them at info (no traceback, no "internal error") and keeps serving."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import fluvial.client as fc
from fluvial.broker.flight.server import TableFlightServer


@pytest.fixture
def raw(broker):
    client = flight.FlightClient(broker.flight_url)
    yield client
    client.close()


def refused(call) -> str:
    # FlightServerError; GetSchema errors reach pyarrow clients as a plain ArrowException.
    with pytest.raises(pa.ArrowException) as info:
        result = call()
        if hasattr(result, "read_all"):
            result.read_all()
        elif result is not None:
            list(result)
    message = str(info.value)
    assert "internal error" not in message, message
    return message


def answer_or_refusal(call) -> None:
    try:
        call()
    except flight.FlightError as exc:
        assert "internal error" not in str(exc), str(exc)


def every_action(raw) -> list[str]:
    return [a.type for a in raw.list_actions()]


def test_malformed_actions_tickets_and_commands(broker, raw, topic_name):
    log_start = broker.log_path.stat().st_size
    with fc.connect(broker.flight_url) as c:
        c.create_table(topic_name, pa.schema([pa.field("id", pa.int64())]), buckets=1)
    actions = every_action(raw)
    assert "create-table" in actions and len(actions) > 8
    for kind in actions:
        # Not a JSON object: every action refuses it.
        for body in (b"{not json", b"[1, 2]", b'"text"', b"\xff\xfe"):
            assert "malformed body" in refused(lambda: raw.do_action(flight.Action(kind, body))), (kind, body)
        # Members of the wrong JSON type: refused by the actions that read them, never an internal error.
        for body in (json.dumps({"table": 5}).encode(), json.dumps({"table": [topic_name], "bucket": "zero"}).encode(),
                     json.dumps({"table": topic_name, "bucket": {"a": 1}, "start": "x", "keys": 7, "name": 3,
                                 "tables": 5, "offsets": "x", "snapshot_id": [], "lease_id": 1}).encode()):
            answer_or_refusal(lambda: list(raw.do_action(flight.Action(kind, body))))
    assert "malformed body of action" in refused(lambda: raw.do_action(flight.Action("describe", b"{not json")))
    create = lambda body: raw.do_action(flight.Action("create-table", json.dumps(body).encode()))  # noqa: E731
    assert "buckets must be an integer" in refused(lambda: create({"table": "x1", "buckets": "three"}))
    assert "buckets must be an integer" in refused(lambda: create({"table": "x2", "buckets": 2.5}))
    assert "malformed" in refused(lambda: create({"table": "x3", "schema": "bm90IGFuIGFycm93IHNjaGVtYQ=="}))
    assert "malformed" in refused(lambda: create({"table": "x4", "schema": "!!not base64!!"}))
    assert "malformed" in refused(lambda: create({"table": "x5", "configs": ["retention.ms", "1"]}))
    assert "unknown action" in refused(lambda: raw.do_action(flight.Action("no-such-action", b"{}")))
    # Tickets: random bytes, empty, JSON of the wrong shape.
    for ticket in (os.urandom(64), b"", b"{}", b"[]", json.dumps({"table": topic_name, "bucket": "0"}).encode(),
                   json.dumps({"table": topic_name, "bucket": 0, "columns": 5}).encode(),
                   json.dumps({"table": topic_name, "bucket": 0, "nope": 1}).encode()):
        message = refused(lambda: raw.do_get(flight.Ticket(ticket)))
        assert "malformed ticket" in message or "Unknown table" in message, (ticket, message)
    # Descriptors: garbage commands, wrong JSON types.
    for command in (os.urandom(32), b"", b"[]", json.dumps({"table": topic_name, "columns": "id"}).encode()):
        descriptor = flight.FlightDescriptor.for_command(command)
        answer_or_refusal(lambda: raw.get_flight_info(descriptor))
        message = refused(lambda: raw.get_schema(descriptor))
        assert "malformed" in message or "names no table" in message, message
    for command in (os.urandom(32), b"{}", json.dumps({"table": topic_name, "bucket": "one"}).encode()):
        descriptor = flight.FlightDescriptor.for_command(command)

        def put():
            writer, _ = raw.do_put(descriptor, pa.schema([pa.field("id", pa.int64())]))
            writer.write_table(pa.table({"id": [1]}))
            writer.close()
        refused(put)
    log = broker.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "Traceback" not in log and "table API request failed" not in log, log[-3000:]
    assert "table API request refused" in log
    # Still serving (the drop-table action above may have dropped the table: a new one).
    with fc.connect(broker.flight_url) as c:
        table = c.create_table(topic_name + "-after", pa.schema([pa.field("id", pa.int64())]), buckets=1)
        table.append(pa.table({"id": [1, 2]}))
        assert table.scan().to_arrow().num_rows == 2
