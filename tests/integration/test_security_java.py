"""Apache Kafka's Java console producer and consumer, and kafka-acls.sh, against Fluvial with
security on: SASL_SSL with SCRAM-SHA-512 and with PLAIN, a JAAS line in the client properties
(`sasl.jaas.config`), the test CA as a PEM trust store (`ssl.truststore.type=PEM`)."""
from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from benchmarks.secure_kafka import Credentials, write_properties
from tests.support.broker_process import BrokerProcess
from tests.support.certs import make_pki
from tests.support.guide import guide_block
from tests.support.java_secure import console_consume, console_produce, kafka_acls, printed_records, run
from tests.support.secure_broker import add_users, authorizer_args, kafka_listener_args

pytestmark = pytest.mark.java

USERS = {"admin": "admin-pw-1", "alice": "alice-pw-2", "bob": "bob-pw-3"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_ssl_broker(tmp_path_factory, pki):
    data = tmp_path_factory.mktemp("sasl-ssl") / "data"
    add_users(data, USERS)
    b = BrokerProcess(data, *kafka_listener_args(pki)).start()
    yield b
    b.stop()


def java_config(tmp_path, pki, mechanism: str, user: str, password: str | None = None):
    creds = Credentials(mechanism, user, password or USERS[user], pki.ca)
    return write_properties(tmp_path / f"{user}-{mechanism}.properties", creds.java())


def high_watermark(broker, pki, topic: str) -> int:
    """Records in the topic's partition 0, read by confluent-kafka as the admin (0: no such topic)."""
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "log_level": 0,
                  **Credentials("SCRAM-SHA-512", "admin", USERS["admin"], pki.ca).confluent()})
    try:
        if topic not in c.list_topics(timeout=15).topics:
            return 0
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)[1]
    finally:
        c.close()


def guide_properties(tmp_path, pki):
    """docs/security.md's alice.properties (SCRAM-SHA-512, JAAS, PEM trust store), its CA path and password replaced."""
    text = guide_block("java client config").replace("/etc/fluvial/tls/ca.pem", str(pki.ca))
    config = tmp_path / "alice.properties"
    config.write_text(text.replace("alice-secret", USERS["alice"]))
    return config


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_java_console_producer_and_consumer_over_sasl_ssl(java_tools, sasl_ssl_broker, pki, tmp_path, topic_name,
                                                          mechanism):
    # SCRAM-SHA-512: the guide's own properties file, as written; PLAIN: PlainLoginModule.
    if mechanism == "SCRAM-SHA-512":
        config = guide_properties(tmp_path, pki)
        assert "ScramLoginModule" in config.read_text() and "ssl.truststore.type=PEM" in config.read_text()
    else:
        config = java_config(tmp_path, pki, mechanism, "alice")
    lines = [f"k{i}:value {i}" for i in range(100)]
    res = console_produce(java_tools, sasl_ssl_broker.bootstrap, topic_name, config, lines)
    assert res.returncode == 0 and b"Exception" not in res.stderr, res.stderr.decode()[-3000:]
    # confluent-kafka (SCRAM-SHA-512 over TLS as another user) sees all of them...
    assert high_watermark(sasl_ssl_broker, pki, topic_name) == 100
    # ...and the Java console consumer reads them back in order.
    res = console_consume(java_tools, sasl_ssl_broker.bootstrap, topic_name, config, len(lines))
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert printed_records(res) == lines


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_java_console_producer_with_a_wrong_password_is_refused(java_tools, sasl_ssl_broker, pki, tmp_path,
                                                                topic_name, mechanism):
    config = java_config(tmp_path, pki, mechanism, "alice", password="not-the-password")
    res = console_produce(java_tools, sasl_ssl_broker.bootstrap, topic_name, config, ["k:v"], timeout=90)
    err = res.stderr.decode()
    assert "SaslAuthenticationException" in err or "failed authentication" in err, err[-3000:]
    # Nothing was written, and the broker still serves the right password.
    assert high_watermark(sasl_ssl_broker, pki, topic_name) == 0


def test_java_client_without_the_ca_does_not_connect(java_tools, sasl_ssl_broker, pki, tmp_path, topic_name):
    """A trust store without the broker's CA: the TLS handshake fails, nothing is sent."""
    other = make_pki(tmp_path / "other-ca")
    creds = Credentials("SCRAM-SHA-512", "alice", USERS["alice"], other.ca)
    config = write_properties(tmp_path / "wrong-ca.properties", creds.java())
    res = console_produce(java_tools, sasl_ssl_broker.bootstrap, topic_name, config, ["k:v"], timeout=90)
    err = res.stderr.decode()
    assert "SSLHandshakeException" in err or "SslAuthenticationException" in err, err[-3000:]
    assert high_watermark(sasl_ssl_broker, pki, topic_name) == 0


def test_kafka_configs_tool_creates_a_scram_user(java_tools, sasl_ssl_broker, pki, tmp_path, topic_name):
    """kafka-configs.sh --alter --add-config SCRAM-SHA-512=[...] --entity-type users (AlterUserScramCredentials)."""
    admin = java_config(tmp_path, pki, "SCRAM-SHA-512", "admin")
    cmd = java_tools.java_tool("kafka.admin.ConfigCommand", "--bootstrap-server", sasl_ssl_broker.bootstrap,
                               "--command-config", str(admin), "--alter", "--add-config",
                               "SCRAM-SHA-512=[password=carol-pw-4]", "--entity-type", "users", "--entity-name", "carol")
    res = run(cmd, 120)
    assert res.returncode == 0, (res.stdout + res.stderr).decode()[-3000:]
    carol = java_config(tmp_path, pki, "SCRAM-SHA-512", "carol", password="carol-pw-4")
    res = console_produce(java_tools, sasl_ssl_broker.bootstrap, topic_name, carol, ["c:1"])
    assert res.returncode == 0 and b"Exception" not in res.stderr, res.stderr.decode()[-3000:]
    assert high_watermark(sasl_ssl_broker, pki, topic_name) == 1


# -- kafka-acls.sh ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory, pki):
    data = tmp_path_factory.mktemp("acl") / "data"
    add_users(data, USERS)
    b = BrokerProcess(data, *kafka_listener_args(pki), *authorizer_args(("User:admin",))).start()
    yield b
    b.stop()


def test_kafka_acls_tool_adds_lists_and_removes_acls(java_tools, acl_broker, pki, tmp_path, topic_name):
    admin = java_config(tmp_path, pki, "SCRAM-SHA-512", "admin")
    alice = java_config(tmp_path, pki, "SCRAM-SHA-512", "alice")
    bob = java_config(tmp_path, pki, "SCRAM-SHA-512", "bob")
    lines = [f"k{i}:v{i}" for i in range(20)]
    # The super user writes; alice has no ACL yet and cannot read.
    res = console_produce(java_tools, acl_broker.bootstrap, topic_name, admin, lines)
    assert res.returncode == 0 and b"Exception" not in res.stderr, res.stderr.decode()[-3000:]
    res = console_consume(java_tools, acl_broker.bootstrap, topic_name, alice, len(lines), timeout_ms=15000)
    assert "TopicAuthorizationException" in res.stderr.decode() or "GroupAuthorizationException" in res.stderr.decode(), \
        res.stderr.decode()[-3000:]
    assert printed_records(res) == []

    # kafka-acls.sh --add: alice may read the topic (literal) and use groups starting with
    # "console-consumer" (prefixed: the console consumer's random group names).
    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--add", "--allow-principal", "User:alice",
                     "--operation", "Read", "--operation", "Describe", "--topic", topic_name)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--add", "--allow-principal", "User:alice",
                     "--operation", "Read", "--group", "console-consumer", "--resource-pattern-type", "prefixed")
    assert res.returncode == 0, res.stderr.decode()[-3000:]

    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--list", "--topic", topic_name)
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    assert "principal=User:alice" in out and "operation=READ" in out and "operation=DESCRIBE" in out, out
    assert "permissionType=ALLOW" in out and "patternType=LITERAL" in out, out
    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--list", "--principal", "User:alice")
    assert "PREFIXED" in res.stdout.decode() and "console-consumer" in res.stdout.decode(), res.stdout.decode()

    # Now alice reads every record; bob, with no ACL, still reads nothing.
    res = console_consume(java_tools, acl_broker.bootstrap, topic_name, alice, len(lines))
    assert res.returncode == 0 and printed_records(res) == lines, res.stderr.decode()[-3000:]
    res = console_consume(java_tools, acl_broker.bootstrap, topic_name, bob, len(lines), timeout_ms=15000)
    assert printed_records(res) == [], res.stdout.decode()

    # A non-super user cannot change ACLs (Alter on the cluster).
    res = kafka_acls(java_tools, acl_broker.bootstrap, alice, "--add", "--allow-principal", "User:bob",
                     "--operation", "Read", "--topic", topic_name)
    assert "ClusterAuthorizationException" in (res.stderr + res.stdout).decode(), (res.stderr + res.stdout).decode()[-3000:]

    # --remove takes the topic's ACLs away again; alice is refused as before.
    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--remove", "--force", "--topic", topic_name)
    assert res.returncode == 0, res.stderr.decode()[-3000:]
    res = kafka_acls(java_tools, acl_broker.bootstrap, admin, "--list", "--topic", topic_name)
    assert "User:alice" not in res.stdout.decode(), res.stdout.decode()
    res = console_consume(java_tools, acl_broker.bootstrap, topic_name, alice, len(lines), timeout_ms=15000)
    assert printed_records(res) == []
    assert "TopicAuthorizationException" in res.stderr.decode(), res.stderr.decode()[-3000:]
