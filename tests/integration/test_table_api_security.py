"""The table API (Arrow Flight) over TLS with basic-auth handshake, bearer tokens and ACLs: the
native client and pyarrow's own Flight client against a broker with a test PKI."""
from __future__ import annotations

import base64

import pyarrow as pa
import pyarrow.flight as flight
import pytest

import fluvial.client as fc
from fluvial.client.client import Table
from fluvial.security.acls import AclOperation as Op, ResourceType
from fluvial.security.config import SecurityConfig
from fluvial.security.principal import Principal
from tests.support.certs import make_pki
from tests.support.secured_broker import SecuredBroker, tls_security

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
ROWS = pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret", "dave": "dave-secret"}
TOPIC_OPS = [Op.READ, Op.WRITE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS]
# Kafka's implications: holding one of these grants DESCRIBE too.
IMPLIES_DESCRIBE = {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secured(tmp_path_factory, pki):
    security = tls_security(pki, flight_tls=True, flight_auth="basic", authorizer=True, super_users=("User:admin",))
    b = SecuredBroker(tmp_path_factory.mktemp("secured") / "data", security, USERS).start()
    yield b
    b.stop()


def connect(broker: SecuredBroker, pki, user: str) -> fc.Client:
    return fc.connect(broker.flight_url, username=user, password=USERS[user], tls_root_certs=str(pki.ca))


@pytest.fixture(scope="module")
def admin(secured, pki):
    with connect(secured, pki, "admin") as c:
        yield c


def test_native_client_over_tls_with_basic_auth_appends_scans_and_looks_up(secured, pki, admin):
    admin.create_table("tls_log", SCHEMA, buckets=2)
    admin.create_table("tls_kv", SCHEMA, primary_key=["id"])
    for table in ("tls_log", "tls_kv"):
        secured.allow("alice", Op.READ, table)
        secured.allow("alice", Op.WRITE, table)
    with connect(secured, pki, "alice") as alice:
        log = alice.table("tls_log")
        assert sum(a.record_count for a in log.append(ROWS)) == 3
        assert sorted(log.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
        kv = alice.table("tls_kv")
        kv.upsert(ROWS)
        assert kv.lookup(pa.table({"id": [2]})).column("name").to_pylist() == ["b"]
        # The listing shows only what alice may describe (a changelog view follows its table).
        assert set(alice.list_tables()) == {"tls_log", "tls_kv", "tls_kv.changelog"}
        assert {"tls_log", "tls_kv"} <= set(admin.list_tables())


def test_bad_credentials_and_missing_credentials_are_refused(secured, pki):
    with pytest.raises(fc.AuthenticationError, match="invalid username or password"):
        fc.connect(secured.flight_url, username="alice", password="wrong", tls_root_certs=str(pki.ca))
    with pytest.raises(fc.AuthenticationError, match="invalid username or password"):
        fc.connect(secured.flight_url, username="mallory", password="x", tls_root_certs=str(pki.ca))
    raw = flight.FlightClient(secured.flight_url, tls_root_certs=pki.ca.read_bytes())
    with pytest.raises(flight.FlightUnauthenticatedError, match="authentication required"):
        list(raw.do_action(flight.Action("list-tables", b"")))
    with pytest.raises(flight.FlightUnauthenticatedError, match="invalid token"):
        list(raw.do_action(flight.Action("list-tables", b""),
                           flight.FlightCallOptions(headers=[(b"authorization", b"Bearer forged.token")])))
    # A token signed by this broker but altered (another user's name) is refused too.
    header = raw.authenticate_basic_token("bob", USERS["bob"])
    payload, _, signature = header[1].decode().split(" ", 1)[1].partition(".")
    forged = base64.urlsafe_b64encode(b'{"user":"admin","exp":9999999999}').rstrip(b"=").decode()
    with pytest.raises(flight.FlightUnauthenticatedError, match="invalid token"):
        list(raw.do_action(flight.Action("list-tables", b""), flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {forged}.{signature}".encode())])))
    # The broker keeps serving good clients.
    with connect(secured, pki, "alice") as alice:
        alice.list_tables()


def test_plaintext_client_against_the_tls_port_fails_clearly(secured):
    plain_url = secured.flight_url.replace("grpc+tls://", "grpc://")
    with pytest.raises(fc.BrokerUnavailableError, match="grpc\\+tls"):
        fc.connect(plain_url, username="alice", password=USERS["alice"])
    with pytest.raises(ValueError, match="grpc\\+tls"):
        fc.connect(plain_url, tls_root_certs="/nonexistent/ca.pem")


def test_untrusted_server_certificate_is_refused(secured, tmp_path):
    other = make_pki(tmp_path / "other")
    with pytest.raises(fc.BrokerUnavailableError):
        fc.connect(secured.flight_url, username="alice", password=USERS["alice"], tls_root_certs=str(other.ca))


# ---- the ACL matrix: every table API action, one principal allowed, one denied ----------------

def _offsets(admin, name):
    return [(o.log_start, o.high_watermark) for o in admin.table(name).offsets()]


def _raw(secured, pki, user):
    raw = flight.FlightClient(secured.flight_url, tls_root_certs=pki.ca.read_bytes())
    return raw, flight.FlightCallOptions(headers=[raw.authenticate_basic_token(user, USERS[user])])


# (action, operation the resource needs, resource type, the call made, what it would change)
MATRIX = [
    ("scan", Op.READ, "log", lambda c, t: t.scan().to_arrow(), None),
    ("scan changelog", Op.READ, "kv", lambda c, t: t.scan().to_arrow(), None),
    ("append", Op.WRITE, "log", lambda c, t: t.append(ROWS), "offsets"),
    ("upsert", Op.WRITE, "kv", lambda c, t: t.upsert(ROWS), "offsets"),
    ("delete", Op.WRITE, "kv", lambda c, t: t.delete(pa.table({"id": [1]})), "offsets"),
    ("lookup", Op.READ, "kv", lambda c, t: t.lookup(pa.table({"id": [1]})), None),
    ("prefix-lookup", Op.READ, "kv", lambda c, t: c._action("prefix-lookup", {"table": t.name}), None),
    ("full-read", Op.READ, "kv", lambda c, t: t.full_read(), None),
    ("kv-snapshots", Op.READ, "kv", lambda c, t: t.snapshots(), None),
    ("kv-remote-snapshot", Op.READ, "kv", lambda c, t: c._action("kv-remote-snapshot", {"table": t.name}), None),
    ("remote-segments", Op.READ, "log", lambda c, t: c._action("remote-segments", {"name": t.name, "bucket": 0}),
     None),
    ("kv-snapshot", Op.ALTER, "kv", lambda c, t: t.snapshot(), "snapshots"),
    ("compact", Op.ALTER, "log", lambda c, t: c._action("compact", {"table": t.name}), None),
    ("describe", Op.DESCRIBE, "log", lambda c, t: c.describe(t.name), None),
    ("offsets", Op.DESCRIBE, "log", lambda c, t: t.offsets(), None),
    ("status", Op.DESCRIBE, "log", lambda c, t: c.storage_status(t.name), None),
    ("lake-info", Op.DESCRIBE, "log", lambda c, t: c.lake_info(t.name), None),
    ("drop-table", Op.DELETE, "log", lambda c, t: c.drop_table(t.name), "exists"),
    ("create-table", Op.CREATE, "new", lambda c, t: c.create_table(t.name, SCHEMA), "exists"),
]


@pytest.mark.parametrize("action, operation, kind, call, changes", MATRIX, ids=[m[0] for m in MATRIX])
def test_acl_matrix(secured, pki, admin, action, operation, kind, call, changes, request):
    name = f"m_{request.node.callspec.id.replace('-', '_').replace(' ', '_')}"
    if kind == "log":
        if action == "compact":
            admin.create_table(name, SCHEMA, configs={"cleanup.policy": "compact"})
        else:
            admin.create_table(name, SCHEMA).append(ROWS)
    elif kind == "kv":
        admin.create_table(name, SCHEMA, primary_key=["id"]).upsert(ROWS)
    admin_table = admin.table(name) if kind != "new" else None
    # Only the row's ACLs: alice holds the operation; bob every other topic operation but
    # those that imply it (DESCRIBE is implied by READ, WRITE, DELETE and ALTER).
    secured.clear_acls()
    secured.allow("alice", operation, name)
    for other in TOPIC_OPS:
        if other != operation and not (operation == Op.DESCRIBE and other in IMPLIES_DESCRIBE):
            secured.allow("bob", other, name)

    def target(client):
        if kind == "new":
            return type("NewTable", (), {"name": name})()
        if action == "scan changelog":  # the changelog view follows its table's ACLs
            return Table(client, admin.table(name + ".changelog").info)
        return Table(client, admin_table.info)

    def state():
        if changes == "offsets":
            return _offsets(admin, name)
        if changes == "exists":
            return name in admin.list_tables()
        if changes == "snapshots":
            return admin.table(name).snapshots()
        return None

    before = state()
    with connect(secured, pki, "bob") as bob:
        with pytest.raises(fc.AuthorizationError, match=f"User:bob is not authorized to {operation.name}"):
            call(bob, target(bob))
    assert state() == before, "a denied call changed the table"
    with connect(secured, pki, "alice") as alice:
        try:
            call(alice, target(alice))
        except fc.AuthorizationError:
            raise
        except fc.FluvialError:
            pass  # refused for another reason (no lake, nothing tiered): the ACL check passed


def test_flight_metadata_calls_and_listings_follow_describe(secured, pki, admin):
    admin.create_table("meta_seen", SCHEMA)
    admin.create_table("meta_hidden", SCHEMA)
    secured.clear_acls()
    secured.allow("alice", Op.DESCRIBE, "meta_seen")
    raw, options = _raw(secured, pki, "alice")
    names = {info.descriptor.path[0].decode() for info in raw.list_flights(options=options)}
    assert names == {"meta_seen"}
    raw.get_flight_info(flight.FlightDescriptor.for_path("meta_seen"), options)
    raw.get_schema(flight.FlightDescriptor.for_path("meta_seen"), options)
    with pytest.raises(flight.FlightUnauthorizedError, match="not authorized to DESCRIBE table 'meta_hidden'"):
        raw.get_flight_info(flight.FlightDescriptor.for_path("meta_hidden"), options)
    # pyarrow's server turns any error of GetSchema into UNKNOWN (its message kept).
    with pytest.raises(pa.ArrowException, match="not authorized to DESCRIBE table 'meta_hidden'"):
        raw.get_schema(flight.FlightDescriptor.for_path("meta_hidden"), options)
    # A scan straight by ticket (DoGet) and an append (DoPut), without the native client.
    from fluvial.client.wire import AppendRequest, ScanRequest
    with pytest.raises(flight.FlightUnauthorizedError, match="not authorized to READ table 'meta_hidden'"):
        raw.do_get(flight.Ticket(ScanRequest("meta_hidden", 0).to_bytes()), options).read_all()
    with pytest.raises(flight.FlightUnauthorizedError, match="not authorized to WRITE table 'meta_seen'"):
        writer, _ = raw.do_put(flight.FlightDescriptor.for_command(AppendRequest("meta_seen").to_bytes()),
                               ROWS.schema, options)
        writer.write_table(ROWS)
        writer.close()
    assert admin.table("meta_seen").offsets()[0].high_watermark == 0
    # Denied before existence is looked at: a name cannot be probed.
    with pytest.raises(flight.FlightUnauthorizedError, match="not authorized"):
        raw.get_flight_info(flight.FlightDescriptor.for_path("no_such_table"), options)
    with connect(secured, pki, "alice") as alice:
        assert alice.list_tables() == ["meta_seen"]
        assert alice.lake_status() == []
    # Lake tiering jobs act for the cluster: CLUSTER_ACTION on the cluster.
    with connect(secured, pki, "alice") as alice:
        with pytest.raises(fc.AuthorizationError, match="CLUSTER_ACTION on the cluster"):
            alice._action("lake-acquire", {"job": "j1"})
    secured.allow("alice", Op.CLUSTER_ACTION, "kafka-cluster", ResourceType.CLUSTER)
    with connect(secured, pki, "alice") as alice:
        assert alice._action("lake-acquire", {"job": "j1"}) is None  # allowed; no lake table is due


def test_create_table_allowed_by_cluster_create(secured, pki, admin):
    secured.clear_acls()
    secured.allow("alice", Op.CREATE, "kafka-cluster", ResourceType.CLUSTER)
    with connect(secured, pki, "alice") as alice:
        alice.create_table("made_by_alice", SCHEMA)
    assert "made_by_alice" in admin.list_tables()


def test_stale_token_is_refused_and_the_client_authenticates_again(secured, pki):
    from fluvial.broker.flight import auth

    raw, options = _raw(secured, pki, "alice")
    signer = auth.TokenSigner(lifetime_s=-1)  # a token that is already expired, signed with another key
    stale = signer.issue(Principal.user("alice"))
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(raw.do_action(flight.Action("list-tables", b""), flight.FlightCallOptions(
            headers=[(b"authorization", f"Bearer {stale}".encode())])))
    with connect(secured, pki, "alice") as alice:
        alice._session._header = (b"authorization", f"Bearer {stale}".encode())
        alice._session._expiry = 0.0  # unknown expiry: renewed only when refused
        alice.list_tables()  # refused once, authenticated again, answered


def test_open_default_needs_no_credentials(tmp_path):
    b = SecuredBroker(tmp_path / "data", SecurityConfig(), {}).start()
    try:
        with fc.connect(b.flight_url) as c:
            c.create_table("open_t", SCHEMA).append(ROWS)
            assert c.table("open_t").scan().to_arrow().num_rows == 3
    finally:
        b.stop()


def test_cli_tools_take_the_user_from_options_and_the_password_from_the_environment(secured, pki, admin, tmp_path):
    import os
    import subprocess
    import sys

    admin.create_table("cli_seen", SCHEMA)
    secured.clear_acls()
    secured.allow("alice", Op.DESCRIBE, "cli_seen")
    base = [sys.executable, "-m", "fluvial.broker", "table", "list", "--url", secured.flight_url,
            "--tls-root-certs", str(pki.ca)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUVIAL_")}
    ok = subprocess.run(base + ["--username", "alice"], env={**env, "FLUVIAL_PASSWORD": USERS["alice"]},
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "cli_seen" in ok.stdout and "meta_hidden" not in ok.stdout
    password_file = tmp_path / "password"
    password_file.write_text("wrong\n")
    bad = subprocess.run(base + ["--username", "alice", "--password-file", str(password_file)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "invalid username or password" in bad.stderr
    assert USERS["alice"] not in bad.stderr + bad.stdout
    anonymous = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert anonymous.returncode != 0 and "authentication required" in anonymous.stderr


def test_lake_tiering_job_authenticates_and_needs_cluster_action(secured, pki):
    from fluvial.tiering.lake.job import TieringWorker

    secured.clear_acls()
    security = fc.ConnectionSecurity("alice", USERS["alice"], str(pki.ca))
    worker = TieringWorker(secured.flight_url, "job-1", security=security)
    with pytest.raises(fc.AuthorizationError, match="CLUSTER_ACTION"):
        worker.run_once()
    secured.allow("alice", Op.CLUSTER_ACTION, "kafka-cluster", ResourceType.CLUSTER)
    assert worker.run_once() is None  # authorized; no lake table is due


def test_a_deleted_users_token_is_refused_at_once(secured, pki):
    raw, options = _raw(secured, pki, "dave")
    list(raw.do_action(flight.Action("list-tables", b""), options))
    secured.delete_user("dave")
    with pytest.raises(flight.FlightUnauthenticatedError, match="no longer exists"):
        list(raw.do_action(flight.Action("list-tables", b""), options))
    with pytest.raises(fc.AuthenticationError):
        connect(secured, pki, "dave")


def test_fluvial_broker_command_with_security_flags(tmp_path, pki):
    """The real `fluvial broker` process, secured with its command-line flags."""
    import requests

    from tests.support.broker_process import BrokerProcess

    b = BrokerProcess(tmp_path / "data", "--flight-tls", "true", "--flight-auth", "basic", "--http-tls", "true",
                      "--http-auth", "basic", "--ssl-certificate-location", str(pki.server.cert),
                      "--ssl-key-location", str(pki.server.key), "--authorizer-enabled", "true",
                      "--super-users", "User:admin", "--user", "admin=admin-secret", "--user", "eve=eve-secret",
                      # mTLS settings of the Kafka listener do not make the HTTP port ask browsers
                      # and registry clients for certificates.
                      "--ssl-client-auth", "required", "--ssl-ca-location", str(pki.ca),
                      "--security-protocol", "SASL_SSL").start()
    try:
        url = f"grpc+tls://localhost:{b.ports['flight_port']}"
        with fc.connect(url, username="admin", password="admin-secret", tls_root_certs=str(pki.ca)) as admin:
            admin.create_table("cli_flags", SCHEMA).append(ROWS)
            assert admin.table("cli_flags").scan().to_arrow().num_rows == 3
        with fc.connect(url, username="eve", password="eve-secret", tls_root_certs=str(pki.ca)) as eve:
            assert eve.list_tables() == []
            with pytest.raises(fc.AuthorizationError):
                eve.table("cli_flags")
        http = f"https://localhost:{b.ports['http_port']}"
        assert requests.get(f"{http}/subjects", verify=str(pki.ca), timeout=10).status_code == 401
        assert requests.get(f"{http}/subjects", auth=("admin", "admin-secret"), verify=str(pki.ca),
                            timeout=10).status_code == 200
        with pytest.raises(fc.AuthenticationError):
            fc.connect(url, username="eve", password="not-eve-secret", tls_root_certs=str(pki.ca))
    finally:
        b.stop()
    log = b.log_path.read_text()
    assert "table API request refused" in log  # eve's refusal is logged ...
    for password in ("admin-secret", "eve-secret"):
        assert password not in log  # ... no password ever is


def test_in_broker_lake_tiering_on_a_secured_table_api_with_an_encrypted_key(tmp_path, pki):
    """The broker's own tiering worker goes through its TLS, authenticated table API (as the
    broker itself), and gRPC gets the encrypted server key decrypted in memory."""
    import time

    from cryptography.hazmat.primitives import serialization

    from tests.support.broker_process import BrokerProcess

    key = serialization.load_pem_private_key(pki.server.key.read_bytes(), None)
    encrypted = tmp_path / "server-encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(b"key-secret")))
    b = BrokerProcess(tmp_path / "data", "--flight-tls", "true", "--flight-auth", "basic",
                      "--ssl-certificate-location", str(pki.server.cert), "--ssl-key-location", str(encrypted),
                      "--ssl-key-password", "key-secret", "--authorizer-enabled", "true",
                      "--super-users", "User:admin", "--user", "admin=admin-secret", "--lake-tiering",
                      "--security-protocol", "SASL_PLAINTEXT").start()
    try:
        url = f"grpc+tls://localhost:{b.ports['flight_port']}"
        with fc.connect(url, username="admin", password="admin-secret", tls_root_certs=str(pki.ca)) as admin:
            admin.create_table("lake_secure", SCHEMA, lake=True, configs={"fluvial.lake.freshness": "1ms"})
            admin.table("lake_secure").append(ROWS)
            deadline = time.monotonic() + 60
            while True:
                status = admin.lake_status("lake_secure")[0]
                if status["state"] == "tiered" and status["lag_records"] == 0 and status["snapshot_id"]:
                    break
                assert time.monotonic() < deadline, (status, b.log_tail())
                time.sleep(0.2)
            assert status["error"] is None
    finally:
        b.stop()


LEASE_ACTIONS = [("lake-acquire", {"job": "j"}), ("lake-heartbeat", {"name": "t", "lease_id": "x"}),
                 ("lake-complete", {"name": "t", "lease_id": "x", "snapshot_id": 1, "offsets": {}}),
                 ("lake-fail", {"name": "t", "lease_id": "x", "error": "e"})]


@pytest.mark.parametrize("action, body", LEASE_ACTIONS, ids=[a for a, _ in LEASE_ACTIONS])
def test_lake_lease_actions_need_cluster_action(secured, pki, action, body):
    secured.clear_acls()
    secured.allow("alice", Op.CLUSTER_ACTION, "kafka-cluster", ResourceType.CLUSTER)
    for op in TOPIC_OPS:  # every topic operation on the table is not enough
        secured.allow("bob", op, "t")
    secured.allow("bob", Op.DESCRIBE, "kafka-cluster", ResourceType.CLUSTER)
    with connect(secured, pki, "bob") as bob:
        with pytest.raises(fc.AuthorizationError, match="CLUSTER_ACTION on the cluster"):
            bob._action(action, body)
    with connect(secured, pki, "alice") as alice:
        try:
            alice._action(action, body)
        except fc.AuthorizationError:
            raise
        except fc.FluvialError:
            pass  # refused by the coordinator (no such table or lease): the ACL check passed
