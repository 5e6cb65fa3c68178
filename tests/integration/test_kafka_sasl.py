"""SASL on the Kafka listener with real clients, and what a client that does not
authenticate properly gets: a clear failure, the connection closed, nothing served."""
from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import struct
import time

import pytest

from fluvial.protocol.errors import ErrorCode
from fluvial.protocol.messages import ApiKey, decode_response, encode_request
from tests.support.broker_process import BrokerProcess

USERS = ("--user", "alice=alice-secret", "--user", "bob=bob-secret")


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    """SASL_PLAINTEXT with PLAIN and SCRAM-SHA-256 (not -512), sessions of 2 s (KIP-368)."""
    b = BrokerProcess(tmp_path_factory.mktemp("sasl") / "data", "--security-protocol", "SASL_PLAINTEXT",
                      "--sasl-enabled-mechanisms", "PLAIN,SCRAM-SHA-256", "--connections-max-reauth-ms", "2000",
                      "--log-level", "debug", *USERS).start()
    yield b
    b.stop()


# ---- a raw Kafka client, to send exactly what a broken client sends ----

class Raw:
    def __init__(self, broker: BrokerProcess):
        self.sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
        self.cid = 0

    def send(self, api_key: int, version: int, body: dict) -> None:
        self.cid += 1
        self.sock.sendall(encode_request(api_key, version, self.cid, body))

    def recv_frame(self) -> bytes:
        head = self._exactly(4)
        return self._exactly(struct.unpack(">i", head)[0])

    def call(self, api_key: int, version: int, body: dict):
        self.send(api_key, version, body)
        return decode_response(api_key, version, self.recv_frame())[1]

    def _exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def closed(self, timeout: float = 5.0) -> bool:
        """True when the broker closed the connection (end of stream or reset), after any
        last answer it sent."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                if self.sock.recv(65536) == b"":
                    return True
            except ConnectionResetError:
                return True
            except socket.timeout:
                return False
        return False

    def plain(self, user: str, password: str, version: int = 2):
        hs = self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert hs.error_code == 0
        return self.call(ApiKey.SASL_AUTHENTICATE, version,
                         {"auth_bytes": f"\0{user}\0{password}".encode()})

    def scram(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256", handshake: bool = True):
        """A SCRAM client written from RFC 5802; returns the final SaslAuthenticate response."""
        digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        if handshake:
            assert self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism}).error_code == 0
        bare = f"n={user},r=clientnonce123"
        first = self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": ("n,," + bare).encode()})
        if first.error_code:
            return first
        sfirst = first.auth_bytes.decode()
        attrs = dict(a.split("=", 1) for a in sfirst.split(","))
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
        ck = hmac.new(salted, b"Client Key", digest).digest()
        wp = f"c=biws,r={attrs['r']}"
        sig = hmac.new(hashlib.new(digest, ck).digest(), f"{bare},{sfirst},{wp}".encode(), digest).digest()
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(ck, sig))).decode()
        return self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": f"{wp},p={proof}".encode()})

    def metadata(self, topics=None):
        return self.call(ApiKey.METADATA, 12, {"topics": topics, "allow_auto_topic_creation": True,
                                               "include_topic_authorized_operations": False})


def _log_has(broker: BrokerProcess, text: str, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in broker.log_path.read_text(errors="replace"):
            return True
        time.sleep(0.05)
    return False


def _topics(broker: BrokerProcess) -> set[str]:
    r = Raw(broker)
    assert r.plain("alice", "alice-secret").error_code == 0
    return {t.name for t in r.metadata(None).topics}


# ---- real clients ----

def test_kafka_python_plain(sasl_broker):
    from kafka import KafkaConsumer, KafkaProducer
    kw = dict(bootstrap_servers=sasl_broker.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
              sasl_plain_username="alice", sasl_plain_password="alice-secret")
    producer = KafkaProducer(**kw)
    values = [f"m{i}".encode() for i in range(5)] + [b"x" * 700_000]  # once authenticated, large requests pass
    for v in values:
        producer.send("plain-topic", v)
    producer.flush(10)
    producer.close()
    consumer = KafkaConsumer("plain-topic", auto_offset_reset="earliest", consumer_timeout_ms=5000, **kw)
    assert [m.value for m in consumer] == values
    consumer.close()


def test_confluent_scram_sha256_and_reauthentication(sasl_broker):
    """librdkafka re-authenticates (KIP-368) before each 2 s session ends and keeps producing
    across several session lifetimes on the same connections."""
    from confluent_kafka import Consumer, Producer
    conf = {"bootstrap.servers": sasl_broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "bob", "sasl.password": "bob-secret"}
    errors = []
    log_before = len(sasl_broker.log_path.read_text(errors="replace"))
    producer = Producer({**conf, "linger.ms": 5})
    sent = 0
    deadline = time.monotonic() + 5.5   # over two session lifetimes
    while time.monotonic() < deadline:
        producer.produce("reauth-topic", f"r{sent}".encode(),
                         on_delivery=lambda err, msg: err and errors.append(err))
        sent += 1
        producer.poll(0.1)
    assert producer.flush(10) == 0
    assert not errors
    consumer = Consumer({**conf, "group.id": "g-reauth", "auto.offset.reset": "earliest"})
    consumer.subscribe(["reauth-topic"])
    got = []
    end = time.monotonic() + 15
    while len(got) < sent and time.monotonic() < end:
        m = consumer.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    consumer.close()
    assert got == [f"r{i}".encode() for i in range(sent)]
    # The sessions were renewed, not dropped: no expiry closed a connection.
    log = sasl_broker.log_path.read_text(errors="replace")[log_before:]
    assert "expired" not in log
    assert log.count("re-authenticated as User:bob with SCRAM-SHA-256") >= 2, log
    import urllib.request
    metrics = urllib.request.urlopen(sasl_broker.http_url + "/metrics", timeout=10).read().decode()
    line = 'fluvial_kafka_sasl_authentications_total{mechanism="SCRAM-SHA-256",outcome="reauthenticated"}'
    assert line in metrics
    assert float(metrics.split(line)[1].split()[0]) >= 2


def test_confluent_wrong_password_fails_clearly(sasl_broker):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": sasl_broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "bob", "sasl.password": "nope"})
    with pytest.raises(KafkaException) as err:
        admin.list_topics(timeout=5)
    assert "uthentication" in str(err.value) or "TRANSPORT" in str(err.value) or "timed out" in str(err.value)


# ---- failures, checked on the wire ----

def test_session_without_reauthentication_is_closed_after_expiry(sasl_broker):
    r = Raw(sasl_broker)
    auth = r.plain("alice", "alice-secret")
    assert auth.error_code == 0 and auth.session_lifetime_ms == 2000
    assert r.metadata([]).brokers
    time.sleep(2.3)
    r.send(ApiKey.METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": False})
    assert r.closed()
    assert _log_has(sasl_broker, "expired")


def test_reauthentication_on_the_raw_wire(sasl_broker):
    r = Raw(sasl_broker)
    assert r.scram("alice", "alice-secret").error_code == 0
    time.sleep(1.0)
    assert r.scram("alice", "alice-secret").error_code == 0  # renews the session
    time.sleep(1.5)  # past the first session's end, within the second's
    assert r.metadata([]).brokers
    # Re-authenticating as someone else is refused and the connection closed.
    resp = r.scram("bob", "bob-secret")
    assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "principal" in resp.error_message
    assert r.closed()


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-secret")])
def test_bad_credentials(sasl_broker, user, password):
    for login in ("plain", "scram"):
        r = Raw(sasl_broker)
        resp = getattr(r, login)(user, password)
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "uthentication failed" in resp.error_message
        assert r.closed()


def test_wrong_mechanism(sasl_broker):
    r = Raw(sasl_broker)
    resp = r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"})
    assert resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert sorted(resp.mechanisms) == ["PLAIN", "SCRAM-SHA-256"]
    assert r.closed()


def test_requests_before_authentication_are_not_served(sasl_broker):
    # ApiVersions is answered (clients ask before the handshake) ...
    r = Raw(sasl_broker)
    versions = r.call(ApiKey.API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert {k.api_key for k in versions.api_keys} >= {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
    # ... Metadata is not: the connection is closed without an answer.
    r.send(ApiKey.METADATA, 12, {"topics": None, "allow_auto_topic_creation": True,
                                 "include_topic_authorized_operations": False})
    assert r.closed()
    # A Produce before authentication writes nothing.
    from tests.integration.test_bad_input import make_batch, produce_body
    r = Raw(sasl_broker)
    r.send(ApiKey.PRODUCE, 9, produce_body("unauth-topic", make_batch()))
    assert r.closed()
    # SaslAuthenticate before SaslHandshake: ILLEGAL_SASL_STATE, then closed.
    r = Raw(sasl_broker)
    resp = r.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0alice-secret"})
    assert resp.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert r.closed()
    assert "unauth-topic" not in _topics(sasl_broker)
    assert _log_has(sasl_broker, "during SASL authentication")


def test_truncated_and_garbled_sasl_frames(sasl_broker):
    # An authenticated client on another connection keeps being served meanwhile.
    good = Raw(sasl_broker)

    def still_served():
        # Re-authenticates first (sessions last 2 s here), then asks for metadata.
        assert good.plain("bob", "bob-secret").error_code == 0
        assert good.metadata([]).brokers
    still_served()
    garbage = [
        b"\x00\x11\x00\x01",                                        # SaslHandshake header cut short
        encode_request(ApiKey.SASL_HANDSHAKE, 1, 1, {"mechanism": "PLAIN"})[4:-3],  # body truncated
        b"\xff" * 40,                                               # not a request at all
    ]
    for payload in garbage:
        r = Raw(sasl_broker)
        r.sock.sendall(struct.pack(">i", len(payload)) + payload)
        assert r.closed()
        still_served()
    # Garbled tokens inside well-formed SaslAuthenticate requests.
    for mechanism, token in [("PLAIN", b"no-separators"), ("PLAIN", b"\0alice\0\xff\xfe"),
                             ("SCRAM-SHA-256", b"\x00\x01garbage"), ("SCRAM-SHA-256", b"p=tls,,n=a,r=b")]:
        r = Raw(sasl_broker)
        assert r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism}).error_code == 0
        resp = r.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": token})
        assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and resp.error_message
        assert r.closed()
        still_served()
    # A frame larger than an unauthenticated client may send (Kafka's sasl.server.max.receive.size).
    r = Raw(sasl_broker)
    r.sock.sendall(struct.pack(">i", 600_000) + b"\0" * 1000)
    assert r.closed()
    still_served()
    # A client that stops half-way through a SCRAM exchange and then sends a second first message.
    r = Raw(sasl_broker)
    assert r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == 0
    assert r.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"n,,n=alice,r=abc"}).error_code == 0
    resp = r.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"n,,n=alice,r=abc"})
    assert resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert resp.auth_bytes.startswith(b"e=")
    assert r.closed()
    # A second handshake in the middle of an exchange.
    r = Raw(sasl_broker)
    assert r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
    assert r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert r.closed()
    still_served()
    assert sasl_broker.alive()
    assert "Traceback" not in sasl_broker.log_path.read_text(errors="replace")


def test_legacy_handshake_v0_raw_tokens(sasl_broker):
    """SaslHandshake v0: the SASL tokens then travel as bare frames (no Kafka header)."""
    r = Raw(sasl_broker)
    assert r.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code == 0
    token = b"\0alice\0alice-secret"
    r.sock.sendall(struct.pack(">i", len(token)) + token)
    assert r.recv_frame() == b""
    assert r.metadata([]).brokers
    r = Raw(sasl_broker)
    assert r.call(ApiKey.SASL_HANDSHAKE, 0, {"mechanism": "PLAIN"}).error_code == 0
    token = b"\0alice\0wrong"
    r.sock.sendall(struct.pack(">i", len(token)) + token)
    assert r.closed()


def test_users_survive_kill9(tmp_path):
    b = BrokerProcess(tmp_path / "data", "--security-protocol", "SASL_PLAINTEXT", "--user", "carol=c-secret").start()
    try:
        assert Raw(b).scram("carol", "c-secret").error_code == 0
        b.kill9()
        b.extra_args = ["--security-protocol", "SASL_PLAINTEXT"]  # no --user: the stored credentials are used
        b.start()
        assert Raw(b).scram("carol", "c-secret").error_code == 0
        assert Raw(b).scram("carol", "other").error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    finally:
        b.stop()
    assert "c-secret" not in (tmp_path / "data" / "users.json").read_text()


def test_sasl_requests_on_a_plaintext_listener(broker):
    """ApiVersions advertises the SASL APIs everywhere, as Kafka does; a listener without SASL
    answers them with ILLEGAL_SASL_STATE and goes on serving the connection."""
    r = Raw(broker)
    assert r.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.ILLEGAL_SASL_STATE
    resp = r.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": b"\0alice\0x"})
    assert resp.error_code == ErrorCode.ILLEGAL_SASL_STATE and resp.error_message
    assert r.metadata([]).brokers


def test_kafka_configs_tool_manages_users(sasl_broker, java_tools, tmp_path):
    """Apache Kafka's own kafka-configs.sh adds a SCRAM user and describes users (which also
    asks for client quotas: none)."""
    import subprocess
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                   "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                   'username="alice" password="alice-secret";\n')

    def configs(*args):
        cmd = java_tools.java_tool("kafka.admin.ConfigCommand", "--bootstrap-server", sasl_broker.bootstrap,
                                   "--command-config", str(cfg), *args)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    r = configs("--alter", "--add-config", "SCRAM-SHA-256=[iterations=8192,password=frank-secret]",
                "--entity-type", "users", "--entity-name", "frank")
    assert r.returncode == 0, r.stderr[-2000:]
    r = configs("--describe", "--entity-type", "users")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "user-principal 'frank' are SCRAM-SHA-256=iterations=8192" in r.stdout
    assert Raw(sasl_broker).scram("frank", "frank-secret").error_code == 0
