"""The HTTP port (schema registry, console, /metrics) over TLS with basic auth and ACLs:
confluent-kafka's schema registry client and plain HTTPS requests."""
from __future__ import annotations

import json

import pytest
import requests
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from fluvial.security.acls import AclOperation as Op, ResourceType
from fluvial.security.config import SecurityConfig
from tests.support.certs import make_pki
from tests.support.secured_broker import SecuredBroker, tls_security

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
AVRO = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]})
AVRO_V2 = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}]})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    security = tls_security(pki, http_tls=True, http_auth="basic", authorizer=True, super_users=("User:admin",))
    b = SecuredBroker(tmp_path_factory.mktemp("http") / "data", security, USERS).start()
    b.allow("alice", Op.WRITE, "orders")          # a producer: registers orders-value
    b.allow("carol", Op.READ, "orders")           # a consumer: reads schemas of orders
    b.allow("carol", Op.CLUSTER_ACTION, "kafka-cluster", ResourceType.CLUSTER)
    yield b
    b.stop()


def registry(secured, pki, user: str | None, password: str | None = None) -> SchemaRegistryClient:
    conf = {"url": secured.http_url, "ssl.ca.location": str(pki.ca)}
    if user is not None:
        conf["basic.auth.user.info"] = f"{user}:{password or USERS[user]}"
    return SchemaRegistryClient(conf)


def test_registry_client_registers_and_reads_over_tls_with_basic_auth(secured, pki):
    alice = registry(secured, pki, "alice")
    schema_id = alice.register_schema("orders-value", Schema(AVRO, "AVRO"))
    assert alice.get_latest_version("orders-value").schema_id == schema_id
    assert "orders-value" in alice.get_subjects()
    # A consumer holding READ finds the schema a record names by id, and the subject.
    carol = registry(secured, pki, "carol")
    assert json.loads(carol.get_schema(schema_id).schema_str)["name"] == "Order"
    assert carol.get_latest_version("orders-value").schema_id == schema_id
    # ... but may not register (WRITE or ALTER is needed).
    with pytest.raises(SchemaRegistryError) as refused:
        carol.register_schema("orders-value", Schema(AVRO_V2, "AVRO"))
    assert refused.value.http_status_code == 403 and refused.value.error_code == 40301
    assert "WRITE or ALTER on topic 'orders'" in refused.value.error_message
    assert [v for v in alice.get_versions("orders-value")] == [1]


def test_missing_or_wrong_credentials_get_401(secured, pki):
    for client in (registry(secured, pki, None), registry(secured, pki, "alice", "wrong"),
                   registry(secured, pki, "nobody", "x")):
        with pytest.raises(SchemaRegistryError) as refused:
            client.get_subjects()
        assert refused.value.http_status_code == 401
        assert refused.value.error_code == 40101
    answer = requests.get(f"{secured.http_url}/subjects", verify=str(pki.ca), timeout=10)
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Basic")
    assert answer.json()["error_code"] == 40101
    garbled = requests.get(f"{secured.http_url}/subjects", verify=str(pki.ca), timeout=10,
                           headers={"Authorization": "Basic !!!not-base64"})
    assert garbled.status_code == 401 and "malformed" in garbled.json()["message"]


def test_subjects_of_topics_the_user_may_not_touch_are_refused_and_hidden(secured, pki):
    alice = registry(secured, pki, "alice")
    alice.register_schema("orders-value", Schema(AVRO, "AVRO"))
    admin = registry(secured, pki, "admin")
    secret_id = admin.register_schema("payments-value", Schema(AVRO_V2, "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        alice.register_schema("payments-value", Schema(AVRO, "AVRO"))
    assert refused.value.http_status_code == 403
    assert [v for v in admin.get_versions("payments-value")] == [1]   # nothing registered
    bob = registry(secured, pki, "bob")
    for call in (lambda: bob.get_latest_version("orders-value"), lambda: bob.get_schema(secret_id),
                 lambda: bob.delete_subject("orders-value"), lambda: alice.delete_subject("orders-value")):
        with pytest.raises(SchemaRegistryError) as refused:
            call()
        assert refused.value.http_status_code == 403
    assert alice.get_versions("orders-value") == [1]     # not deleted
    assert "payments-value" not in alice.get_subjects() and "orders-value" in alice.get_subjects()
    assert bob.get_subjects() == []
    assert set(admin.get_subjects()) >= {"orders-value", "payments-value"}
    # Compatibility settings are the topic's configs (ALTER_CONFIGS); the global one the cluster's.
    for path, body in ((f"/config/orders-value", {"compatibility": "NONE"}), ("/config", {"compatibility": "NONE"})):
        answer = requests.put(secured.http_url + path, json=body, auth=("alice", USERS["alice"]),
                              verify=str(pki.ca), timeout=10)
        assert answer.status_code == 403, answer.text
        answer = requests.put(secured.http_url + path, json=body, auth=("admin", USERS["admin"]),
                              verify=str(pki.ca), timeout=10)
        assert answer.status_code == 200, answer.text


def test_console_and_metrics_behind_basic_auth(secured, pki):
    def get(path, user=None):
        auth = (user, USERS[user]) if user else None
        return requests.get(secured.http_url + path, auth=auth, verify=str(pki.ca), timeout=30)

    assert get("/console/").status_code == 401
    assert get("/metrics").status_code == 401
    assert get("/console/static/console.css").status_code == 401
    assert get("/console/", "alice").status_code == 403        # no DESCRIBE on the cluster
    assert get("/metrics", "alice").status_code == 403
    assert get("/console/", "admin").status_code == 200
    assert "fluvial_" in get("/metrics", "admin").text
    # Table pages follow the table's ACLs: alice (WRITE implies DESCRIBE) sees the page,
    # but its rows need READ; bob sees neither.
    registry(secured, pki, "alice").register_schema("orders-value", Schema(AVRO, "AVRO"))
    admin = SchemaRegistryClient({"url": secured.http_url, "ssl.ca.location": str(pki.ca),
                                  "basic.auth.user.info": "admin:admin-secret"})
    assert admin.get_subjects()
    assert get("/console/schemas/orders-value", "alice").status_code == 200
    assert get("/console/schemas/orders-value", "bob").status_code == 403
    assert get("/console/tables/orders/rows", "alice").status_code == 403


def test_plain_http_against_the_tls_port_fails(secured):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(secured.http_url.replace("https://", "http://") + "/subjects", timeout=10)


def test_open_default_http_port_needs_no_credentials(tmp_path):
    b = SecuredBroker(tmp_path / "data", SecurityConfig(), {}).start()
    try:
        assert requests.get(f"{b.http_url}/subjects", timeout=10).json() == []
        assert requests.get(f"{b.http_url}/console/", timeout=30).status_code == 200
    finally:
        b.stop()


def test_a_schema_referencing_another_topics_subject_needs_describe_on_it(secured, pki):
    money = json.dumps({"type": "record", "name": "Money", "fields": [{"name": "cents", "type": "long"}]})
    admin = registry(secured, pki, "admin")
    admin.register_schema("money-value", Schema(money, "AVRO"))
    order = json.dumps({"type": "record", "name": "PricedOrder", "fields": [{"name": "price", "type": "Money"}]})
    body = {"schema": order, "references": [{"name": "Money", "subject": "money-value", "version": 1}]}
    url = f"{secured.http_url}/subjects/orders-value/versions"
    refused = requests.post(url, json=body, auth=("alice", USERS["alice"]), verify=str(pki.ca), timeout=10)
    assert refused.status_code == 403, refused.text
    assert "references subject 'money-value'" in refused.json()["message"]
    secured.allow("alice", Op.DESCRIBE, "money")
    # Allowed now; the registry itself does not take references yet (its own 422).
    answered = requests.post(url, json=body, auth=("alice", USERS["alice"]), verify=str(pki.ca), timeout=10)
    assert answered.status_code == 422 and "references" in answered.json()["message"], answered.text


def test_schema_cli_with_credentials_over_tls(secured, pki):
    import os
    import subprocess
    import sys

    registry(secured, pki, "alice").register_schema("orders-value", Schema(AVRO, "AVRO"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUVIAL_")}
    base = [sys.executable, "-m", "fluvial.broker", "schema", "list", "--registry", secured.http_url,
            "--tls-root-certs", str(pki.ca)]
    ok = subprocess.run(base + ["--username", "carol"], env={**env, "FLUVIAL_PASSWORD": USERS["carol"]},
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split() == ["orders-value"]   # carol may describe orders only
    refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "error 40101" in refused.stderr
