"""The registry's HTTP surface as any client sees it: status codes, error bodies, content type, restarts."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.registry import SchemaRegistry
from tests.integration.test_registry_confluent import RegistryServer

CT = "application/vnd.schemaregistry.v1+json"
V1 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})
V2 = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},
                                                          {"name": "b", "type": "string"}]})


def call(url: str, method: str = "GET", body=None) -> tuple[int, str, object]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": CT})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], json.loads(e.read())


@pytest.fixture
def db(tmp_path):
    return tmp_path / "meta.db"


def test_http_answers_and_errors(db):
    with RegistryServer(SchemaRegistry(MetadataStore(db))) as s:
        u = s.url
        status, ctype, body = call(f"{u}/subjects/t-value/versions", "POST", {"schema": V1})
        assert (status, ctype, body) == (200, CT, {"id": 1})
        assert call(f"{u}/schemas/types")[2] == ["AVRO", "JSON"]
        assert call(f"{u}/schemas/ids/1/versions")[2] == [{"subject": "t-value", "version": 1}]
        assert call(f"{u}/subjects/t-value/versions/latest")[2] == {"subject": "t-value", "version": 1, "id": 1,
                                                                    "schema": V1}
        status, _, body = call(f"{u}/compatibility/subjects/t-value/versions/latest?verbose=true", "POST",
                               {"schema": V2})
        assert status == 200 and body["is_compatible"] is False and "'b'" in body["messages"][0]
        status, _, body = call(f"{u}/subjects/t-value/versions", "POST", {"schema": V2})
        assert (status, body["error_code"]) == (409, 409) and "'b'" in body["message"]
        status, _, body = call(f"{u}/subjects/t-value/versions", "POST", {"schema": "{"})
        assert (status, body["error_code"]) == (422, 42201) and body["message"]
        assert call(f"{u}/subjects/t-value/versions/abc")[2]["error_code"] == 42202
        assert call(f"{u}/config/t-value")[2]["error_code"] == 40408
        assert call(f"{u}/config/t-value?defaultToGlobal=true")[2] == {"compatibilityLevel": "BACKWARD"}
        assert call(f"{u}/config", "PUT", {"compatibility": "SIDEWAYS"})[2]["error_code"] == 42203
        assert call(f"{u}/subjects/nope", "POST", {"schema": V1})[2]["error_code"] == 40401
        assert call(f"{u}/subjects/t-value", "POST", {"schema": V2})[2]["error_code"] == 40403
        assert call(f"{u}/subjects/t-value?permanent=true", "DELETE")[2]["error_code"] == 40405
        assert call(f"{u}/subjects/t-value", "DELETE")[2] == [1]
        assert call(f"{u}/subjects?deleted=true")[2] == ["t-value"]
        assert call(f"{u}/subjects/t-value?permanent=true", "DELETE")[2] == [1]
        assert call(f"{u}/subjects?deleted=true")[2] == []
        status, ctype, body = call(f"{u}/no/such/path")
        assert status == 404 and body["error_code"] == 404


def test_ids_survive_a_restart(db):
    with RegistryServer(SchemaRegistry(MetadataStore(db))) as s:
        a = call(f"{s.url}/subjects/a-value/versions", "POST", {"schema": V1})[2]["id"]
        b = call(f"{s.url}/subjects/b-value/versions", "POST",
                 {"schema": json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}}),
                  "schemaType": "JSON"})[2]["id"]
    with RegistryServer(SchemaRegistry(MetadataStore(db))) as s:
        assert call(f"{s.url}/schemas/ids/{a}")[2] == {"schema": V1}
        assert call(f"{s.url}/schemas/ids/{b}")[2]["schemaType"] == "JSON"
        assert call(f"{s.url}/subjects/a-value/versions", "POST", {"schema": V1})[2] == {"id": a}
        c = call(f"{s.url}/subjects/c-value/versions", "POST", {"schema": V2})[2]["id"]
        assert c not in (a, b)
