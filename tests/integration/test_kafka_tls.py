"""TLS on the Kafka listener (SASL_SSL and SSL with client certificates), users managed
through Kafka's DescribeUserScramCredentials / AlterUserScramCredentials and `fluvial user`."""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time

import pytest

from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request
from tests.support.broker_process import BrokerProcess
from tests.support.certs import make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_args(pki) -> list[str]:
    return ["--ssl-certificate-location", str(pki.server.cert), "--ssl-key-location", str(pki.server.key)]


@pytest.fixture(scope="module")
def sasl_ssl_broker(tmp_path_factory, pki):
    b = BrokerProcess(tmp_path_factory.mktemp("sasl-ssl") / "data", "--security-protocol", "SASL_SSL",
                      *_tls_args(pki), "--user", "alice=alice-secret", "--user", "admin=admin-secret").start()
    yield b
    b.stop()


def _conf(broker, pki, user="alice", password="alice-secret", mechanism="SCRAM-SHA-512") -> dict:
    return {"bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, "ssl.ca.location": str(pki.ca)}


def _consume_confluent(conf: dict, topic: str, n: int) -> list[bytes]:
    from confluent_kafka import Consumer
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, end = [], time.monotonic() + 20
    while len(got) < n and time.monotonic() < end:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    return got


def test_confluent_scram_sha512_over_tls(sasl_ssl_broker, pki):
    from confluent_kafka import Producer
    conf = _conf(sasl_ssl_broker, pki)
    p = Producer(conf)
    for i in range(20):
        p.produce("tls-topic", f"v{i}".encode())
    assert p.flush(15) == 0
    assert _consume_confluent(conf, "tls-topic", 20) == [f"v{i}".encode() for i in range(20)]


def test_aiokafka_scram_sha512_over_tls(sasl_ssl_broker, pki):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def run():
        kw = dict(bootstrap_servers=sasl_ssl_broker.bootstrap, security_protocol="SASL_SSL",
                  sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="alice", sasl_plain_password="alice-secret",
                  ssl_context=create_ssl_context(cafile=str(pki.ca)))
        producer = AIOKafkaProducer(**kw)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait("aio-tls", f"a{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer("aio-tls", auto_offset_reset="earliest", group_id="aio-g", **kw)
        await consumer.start()
        got = []
        try:
            while len(got) < 10:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 20)
                for records in batch.values():
                    got += [r.value for r in records]
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(10)]


def test_alter_user_scram_credentials_with_confluent_admin(sasl_ssl_broker, pki):
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)
    admin = AdminClient(_conf(sasl_ssl_broker, pki, "admin", "admin-secret"))
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"dave-secret", b"salt-of-dave")])
    futures["dave"].result(10)
    described = admin.describe_user_scram_credentials(["dave"])["dave"].result(10)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 8192)]
    # The new user logs in and produces.
    p = Producer(_conf(sasl_ssl_broker, pki, "dave", "dave-secret"))
    p.produce("dave-topic", b"by dave")
    assert p.flush(15) == 0
    # Kafka's errors: deleting a credential that does not exist, too few iterations.
    futures = admin.alter_user_scram_credentials([
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256),
        UserScramCredentialUpsertion("weak", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")])
    with pytest.raises(KafkaException) as err:
        futures["nobody"].result(10)
    assert err.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    with pytest.raises(KafkaException) as err:
        futures["weak"].result(10)
    assert err.value.args[0].code() == ErrorCode.UNACCEPTABLE_CREDENTIAL
    with pytest.raises(KafkaException) as err:
        admin.describe_user_scram_credentials(["weak"])["weak"].result(10)
    assert err.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND
    # Deleting dave's only credential removes dave: he can no longer log in.
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_512)])[
        "dave"].result(10)
    from confluent_kafka.admin import AdminClient as A2
    with pytest.raises(KafkaException):
        A2(_conf(sasl_ssl_broker, pki, "dave", "dave-secret")).list_topics(timeout=5)


def _run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fluvial.broker", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_user_cli_online_and_offline(sasl_ssl_broker, pki, tmp_path):
    conn = ["--bootstrap", sasl_ssl_broker.bootstrap, "--security-protocol", "SASL_SSL",
            "--sasl-mechanism", "SCRAM-SHA-256", "--username", "admin", "--ssl-ca-location", str(pki.ca)]
    env = {"FLUVIAL_PASSWORD": "admin-secret", "FLUVIAL_NEW_PASSWORD": "erin-secret"}
    r = _run_cli("user", "add", "erin", *conn, env=env)
    assert r.returncode == 0, r.stderr
    r = _run_cli("user", "list", *conn, env=env)
    assert r.returncode == 0, r.stderr
    assert '"erin"' in r.stdout and "SCRAM-SHA-512" in r.stdout and '"alice"' in r.stdout
    from confluent_kafka.admin import AdminClient
    AdminClient(_conf(sasl_ssl_broker, pki, "erin", "erin-secret", "SCRAM-SHA-256")).list_topics(timeout=10)
    r = _run_cli("user", "delete", "erin", *conn, env=env)
    assert r.returncode == 0, r.stderr
    r = _run_cli("user", "list", "erin", *conn, env=env)
    assert r.returncode == 1 and "erin" in r.stdout
    r = _run_cli("user", "add", "x", *conn, "--timeout", "3",
                 env={"FLUVIAL_PASSWORD": "wrong", "FLUVIAL_NEW_PASSWORD": "p"})
    assert r.returncode != 0
    # Offline edits are refused while a broker runs on the data dir (it would overwrite them).
    r = _run_cli("user", "add", "zed", "--data-dir", str(sasl_ssl_broker.data_dir), env={"FLUVIAL_NEW_PASSWORD": "z"})
    assert r.returncode != 0 and "a broker is running" in r.stderr
    # Offline, on the data dir of a stopped broker.
    data = tmp_path / "offline"
    r = _run_cli("user", "add", "root", "--data-dir", str(data), env={"FLUVIAL_NEW_PASSWORD": "root-secret"})
    assert r.returncode == 0, r.stderr
    r = _run_cli("user", "list", "--data-dir", str(data))
    assert '"root"' in r.stdout
    b = BrokerProcess(data, "--security-protocol", "SASL_SSL", *_tls_args(pki)).start()
    try:
        AdminClient(_conf(b, pki, "root", "root-secret")).list_topics(timeout=10)
    finally:
        b.stop()


@pytest.fixture(scope="module")
def mtls_broker(tmp_path_factory, pki):
    b = BrokerProcess(tmp_path_factory.mktemp("mtls") / "data", "--security-protocol", "SSL", *_tls_args(pki),
                      "--ssl-ca-location", str(pki.ca), "--ssl-client-auth", "required",
                      "--ssl-handshake-timeout-ms", "1500",
                      "--authorizer-enabled", "true", "--super-users", "User:CN=alice",
                      "--allow-everyone-if-no-acl-found", "false").start()
    yield b
    b.stop()


def _tls_call(broker, ctx: ssl.SSLContext, api_key: int, version: int, body: dict):
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(encode_request(api_key, version, 1, body))
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[:4], "big"):
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionError("closed by the broker")
                buf += chunk
            return decode_response(api_key, version, buf[4:])[1]


def _client_ctx(pki, cn: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if cn:
        c = pki.client(cn)
        ctx.load_cert_chain(str(c.cert), str(c.key))
    return ctx


def test_mtls_principal_is_the_certificate_subject(mtls_broker, pki):
    # CN=alice is a super user: the principal the broker built is User:CN=alice.
    alice = _tls_call(mtls_broker, _client_ctx(pki, "alice"), 50, 0, {"users": None})
    assert alice.error_code == 0
    bob = _tls_call(mtls_broker, _client_ctx(pki, "bob"), 50, 0, {"users": None})
    assert bob.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # DescribeClientQuotas (asked by kafka-configs.sh) needs DESCRIBE_CONFIGS on the cluster.
    quotas = {"components": [], "strict": False}
    assert _tls_call(mtls_broker, _client_ctx(pki, "bob"), 48, 1, quotas).error_code == \
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert _tls_call(mtls_broker, _client_ctx(pki, "alice"), 48, 1, quotas).entries == []
    # AlterUserScramCredentials needs ALTER on the cluster: bob's is refused and changes nothing.
    from fluvial.protocol.messages import request_class
    A = request_class(51)
    upsert = {"deletions": [], "upsertions": [A.ScramCredentialUpsertion(
        name="mallory", mechanism=2, iterations=4096, salt=b"s" * 16, salted_password=b"p" * 64)]}
    refused = _tls_call(mtls_broker, _client_ctx(pki, "bob"), 51, 0, upsert)
    assert [(r.user, r.error_code) for r in refused.results] == [("mallory", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)]
    after = _tls_call(mtls_broker, _client_ctx(pki, "alice"), 50, 0, {"users": None})
    assert "mallory" not in [r.user for r in after.results]
    done = _tls_call(mtls_broker, _client_ctx(pki, "alice"), 51, 0, upsert)
    assert [(r.user, r.error_code) for r in done.results] == [("mallory", 0)]
    # confluent-kafka with a client certificate.
    from confluent_kafka import Producer
    c = pki.client("alice")
    p = Producer({"bootstrap.servers": mtls_broker.bootstrap, "security.protocol": "SSL",
                  "ssl.ca.location": str(pki.ca), "ssl.certificate.location": str(c.cert),
                  "ssl.key.location": str(c.key)})
    p.produce("mtls-topic", b"from alice")
    assert p.flush(15) == 0


def test_failed_and_stalled_tls_handshakes(mtls_broker, pki):
    log_before = len(mtls_broker.log_path.read_text(errors="replace"))
    # A client without a certificate: the handshake fails (required), logged, no traceback.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        _tls_call(mtls_broker, _client_ctx(pki, None), ApiKey.API_VERSIONS, 0, {})
    # A plaintext Kafka client on the TLS port.
    with socket.create_connection(("127.0.0.1", mtls_broker.port), timeout=10) as s:
        s.sendall(encode_request(ApiKey.API_VERSIONS, 0, 1, {}))
        s.settimeout(5)
        try:
            while s.recv(100):   # a TLS alert perhaps, then the end of the stream
                pass
        except ConnectionResetError:
            pass
    # A client that connects and never says anything does not hold up others, and is dropped.
    stalled = socket.create_connection(("127.0.0.1", mtls_broker.port), timeout=10)
    assert _tls_call(mtls_broker, _client_ctx(pki, "alice"), ApiKey.API_VERSIONS, 0, {}).error_code == 0
    stalled.settimeout(5)
    try:
        assert stalled.recv(1) == b""
    except ConnectionResetError:
        pass
    stalled.close()
    deadline = time.monotonic() + 5   # the line is written just after the connection is dropped
    while True:
        log = mtls_broker.log_path.read_text(errors="replace")[log_before:]
        if log.count("TLS handshake with") >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert log.count("TLS handshake with") >= 3, log
    assert "Traceback" not in log
    assert mtls_broker.alive()


def test_alter_user_scram_credentials_errors_on_the_wire(mtls_broker, pki):
    """Kafka's per-user codes; a user with any refused alteration keeps its credentials as
    they were (all or nothing per user), other users in the request are applied."""
    from fluvial.protocol.messages import request_class
    A = request_class(51)

    def up(name, mechanism=2, iterations=4096):
        return A.ScramCredentialUpsertion(name=name, mechanism=mechanism, iterations=iterations, salt=b"s" * 16,
                                          salted_password=b"p" * 64)
    alice = _client_ctx(pki, "alice")
    r = _tls_call(mtls_broker, alice, 51, 0, {"deletions": [A.ScramCredentialDeletion(name="gina", mechanism=9)],
                                              "upsertions": [up("gina", 1), up(""), up("bad\x01name"),
                                                             up("hank", 7), up("ivy"), up("ivy"),
                                                             up("jack", 2, 100_000), up("kim", 1)]})
    codes = {x.user: x.error_code for x in r.results}
    assert codes == {"gina": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
                     "bad\x01name": ErrorCode.UNACCEPTABLE_CREDENTIAL, "hank": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                     "ivy": ErrorCode.DUPLICATE_RESOURCE, "jack": ErrorCode.UNACCEPTABLE_CREDENTIAL, "kim": 0}
    described = _tls_call(mtls_broker, alice, 50, 0, {"users": None})
    names = {x.user for x in described.results}
    assert "kim" in names and not names & {"gina", "hank", "ivy", "jack"}
    D = request_class(50)
    dup = _tls_call(mtls_broker, alice, 50, 0, {"users": [D.UserName(name="kim"), D.UserName(name="kim"),
                                                         D.UserName(name="zed")]})
    assert {x.user: x.error_code for x in dup.results} == {"kim": ErrorCode.DUPLICATE_RESOURCE,
                                                           "zed": ErrorCode.RESOURCE_NOT_FOUND}


def test_tls_handshake_failures_are_counted(sasl_ssl_broker):
    import urllib.request

    def failures() -> float:
        metrics = urllib.request.urlopen(sasl_ssl_broker.http_url + "/metrics", timeout=10).read().decode()
        return float(metrics.split("\nfluvial_kafka_tls_handshake_failures_total ")[1].split()[0])
    before = failures()
    with socket.create_connection(("127.0.0.1", sasl_ssl_broker.port), timeout=10) as s:
        s.sendall(encode_request(ApiKey.API_VERSIONS, 0, 1, {}))   # plaintext on a TLS port
        try:
            while s.recv(100):
                pass
        except ConnectionResetError:
            pass
    deadline = time.monotonic() + 5
    while failures() < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failures() == before + 1
