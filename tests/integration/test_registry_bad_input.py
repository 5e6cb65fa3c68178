"""The registry answers client mistakes with Confluent's 4xx codes, never 500 or a hang."""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.registry import SchemaRegistry
from tests.integration.test_registry_confluent import RegistryServer

CT = "application/vnd.schemaregistry.v1+json"
AVRO = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})


def call(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CT})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def register(base: str, subject: str, body: dict | bytes) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return call(f"{base}/subjects/{urllib.parse.quote(subject, safe='')}/versions", "POST", data)


def nested_avro(depth: int) -> str:
    """A record nested `depth` deep, written as text (json.dumps itself stops at ~1000)."""
    head = "".join(f'{{"type": "record", "name": "r{i}", "fields": [{{"name": "f", "type": ' for i in range(depth))
    return head + '"long"' + "}]}" * depth


def nested_json_schema(depth: int) -> str:
    return '{"type": "object", "properties": {"x": ' * depth + '{"type": "integer"}' + "}}" * depth


def test_deep_nesting_is_a_client_error(broker):
    base = broker.http_url
    log_start = broker.log_path.stat().st_size
    # A body nested deeper than any JSON parser follows: 400 Malformed JSON.
    status, body = register(base, "deep-body", b"[" * 200_000 + b"]" * 200_000)
    assert status == 400, body
    # Schemas nested deeper than the registry walks: 422 invalid schema, for both types.
    status, body = register(base, "deep-avro", {"schema": nested_avro(3000)})
    assert (status, body["error_code"]) == (422, 42201), body
    status, body = register(base, "deep-json", {"schema": nested_json_schema(3000), "schemaType": "JSON"})
    assert (status, body["error_code"]) == (422, 42201), body
    # A moderately nested schema still registers.
    assert register(base, "nested-ok", {"schema": nested_avro(20)})[0] == 200
    log = broker.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "Traceback" not in log and "request failed" not in log, log[-2000:]


def test_ids_and_versions_out_of_range_are_not_found(broker):
    base = broker.http_url
    for path in ("/schemas/ids/18446744073709551616", "/schemas/ids/-1", "/schemas/ids/2147483648/versions",
                 "/schemas/ids/99999999999999999999999/subjects", "/schemas/ids/abc"):
        status, body = call(base + path)
        assert (status, body["error_code"]) == (404, 40403), (path, body)
    assert register(base, "ranged", {"schema": AVRO})[0] == 200
    status, body = call(f"{base}/subjects/ranged/versions/18446744073709551616")
    assert (status, body["error_code"]) == (422, 42202), body


def test_subject_names_and_refs_outside_the_schema_are_refused(broker):
    base = broker.http_url
    for subject in ("bad\x00subject", "tab\there", "x" * 256):
        status, body = register(base, subject, {"schema": AVRO})
        assert (status, body["error_code"]) == (422, 42208), (subject, body)
    # Any other text is a subject: dots, spaces, unicode, the longest topic's value subject.
    for subject in ("com.example.Orders-value", "with space", "名前-value", "t" * 249 + "-value"):
        assert register(base, subject, {"schema": AVRO})[0] == 200, subject
    remote = {"type": "object", "properties": {"a": {"$ref": "https://example.com/other.json"}}}
    status, body = register(base, "refs", {"schema": json.dumps(remote), "schemaType": "JSON"})
    assert (status, body["error_code"]) == (422, 42201) and "$ref" in body["message"], body
    local = {"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    assert register(base, "refs", {"schema": json.dumps(local), "schemaType": "JSON"})[0] == 200
    status, body = register(base, "refs2", {"schema": AVRO, "references": [
        {"name": "x", "subject": "other", "version": 1}]})
    assert (status, body["error_code"]) == (422, 42201), body


def test_body_shorter_than_content_length_is_answered_408(tmp_path):
    with RegistryServer(SchemaRegistry(MetadataStore(tmp_path / "meta.db")), body_timeout_s=1.0) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            body = json.dumps({"schema": AVRO}).encode()
            sock.sendall(b"POST /subjects/s/versions HTTP/1.1\r\nHost: x\r\nContent-Type: " + CT.encode()
                         + b"\r\nContent-Length: " + str(len(body) + 100).encode() + b"\r\n\r\n" + body)
            started = time.monotonic()
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408"), reply
            assert time.monotonic() - started < 8
        # The registry goes on serving.
        status, body = register(server.url, "s", {"schema": AVRO})
        assert (status, body) == (200, {"id": 1})
