"""`fluvial schema ...` as a user runs it, against a running registry."""
from __future__ import annotations

import json
import subprocess
import sys

from fluvial.broker.metadata import MetadataStore
from fluvial.schema.registry import SchemaRegistry
from tests.integration.test_registry_confluent import RegistryServer


def fluvial(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fluvial.broker.cli", *args], capture_output=True, text=True,
                          timeout=60)


def test_schema_cli(tmp_path):
    v1 = tmp_path / "v1.avsc"
    v1.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}))
    bad = tmp_path / "bad.avsc"
    bad.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "z", "type": "int"}]}))
    js = tmp_path / "v.json"
    js.write_text(json.dumps({"type": "object", "properties": {"x": {"type": "integer"}}}))
    with RegistryServer(SchemaRegistry(MetadataStore(tmp_path / "meta.db"))) as s:
        url = ("--url", s.url)
        r = fluvial("schema", "register", "orders-value", "--file", str(v1), *url)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"subject": "orders-value", "id": 1, "version": 1}
        r = fluvial("schema", "register", "clicks-value", "--file", str(js), "--type", "JSON", *url)
        assert json.loads(r.stdout)["id"] == 2
        assert fluvial("schema", "list", *url).stdout.split() == ["clicks-value", "orders-value"]
        assert json.loads(fluvial("schema", "list", "orders-value", *url).stdout) == [1]
        got = json.loads(fluvial("schema", "get", "orders-value", *url).stdout)
        assert got["id"] == 1 and json.loads(got["schema"])["fields"] == [{"name": "a", "type": "int"}]
        assert json.loads(fluvial("schema", "get", "--id", "2", "--schema-only", *url).stdout)["type"] == "object"
        r = fluvial("schema", "check", "orders-value", str(bad), "--registry", s.url)
        assert r.returncode == 1 and json.loads(r.stdout)["is_compatible"] is False
        r = fluvial("schema", "register", "orders-value", "--file", str(bad), *url)
        assert r.returncode == 1 and r.stderr.startswith("error 409:")
        r = fluvial("schema", "get", "nope-value", *url)
        assert r.returncode == 1 and r.stderr.startswith("error 40401:")
        assert json.loads(fluvial("schema", "config", "orders-value", "--set", "full", *url).stdout) == {
            "compatibility": "FULL"}
        assert json.loads(fluvial("schema", "config", *url).stdout) == {"compatibilityLevel": "BACKWARD"}
        assert json.loads(fluvial("schema", "delete", "clicks-value", *url).stdout) == [1]
