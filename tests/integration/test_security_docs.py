"""docs/security.md runs as written: the guide's OpenSSL commands make the certificates, its
offline `fluvial user add` the first administrator, the broker starts from its config file, then every
`python` block and every shell block marked `<!-- run as shell -->` runs in order against it
(blocks marked `<!-- run with spark -->` in a Spark session), with the guide's paths and
ports replaced by the test's certificates and free ports."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker_process import BrokerProcess
from tests.support.certs import make_pki
from tests.support.guide import SECURITY_GUIDE, blocks, guide_block

DOC = SECURITY_GUIDE
TLS_DIR = "/etc/fluvial/tls"


def tls_files(pki, directory: Path) -> Path:
    """The test PKI under the guide's file names (ca.pem, server.pem, server.key, alice.pem, alice.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(pki.ca, directory / "ca.pem")
    shutil.copy(pki.server.cert, directory / "server.pem")
    shutil.copy(pki.server.key, directory / "server.key")
    alice = pki.client("alice", pki.ca.parent)
    shutil.copy(alice.cert, directory / "alice.pem")
    shutil.copy(alice.key, directory / "alice.key")
    return directory


class GuideBroker:
    """A broker started from the guide's config file, and the guide's text made to point at it."""

    def __init__(self, tmp_path: Path):
        self.tls = tmp_path / "tls"
        if shutil.which("openssl"):   # the guide's own OpenSSL commands make the CA and the certificates
            run_shell(guide_block("certificates").replace(TLS_DIR, str(self.tls)), tmp_path)
            run_shell(guide_block("client certificate").replace(TLS_DIR, str(self.tls)), tmp_path)
            assert {"ca.pem", "server.pem", "server.key", "alice.pem", "alice.key"} <= {f.name for f in self.tls.iterdir()}
        else:
            tls_files(make_pki(tmp_path / "pki"), self.tls)
        config = guide_block("broker config").replace(TLS_DIR, str(self.tls))
        # Tests listen on loopback only (the guide's 0.0.0.0 would open the test broker to the network).
        config = config.replace("host=0.0.0.0", "host=127.0.0.1")
        self.config_file = tmp_path / "broker.properties"
        self.config_file.write_text(config)
        self.broker = BrokerProcess(tmp_path / "data", "--config", str(self.config_file))
        # The guide's second broker: client certificates only (mTLS), started when its example runs.
        mtls_config = tmp_path / "mtls.properties"
        mtls_config.write_text(guide_block("mtls broker config").replace(TLS_DIR, str(self.tls)))
        self.mtls = BrokerProcess(tmp_path / "mtls-data", "--config", str(mtls_config))
        self.cwd = tmp_path / "cwd"
        self.cwd.mkdir()

    def start(self) -> "GuideBroker":
        # The guide's first administrator, written offline into the data directory.
        first_admin = guide_block("run before the broker starts").replace("/var/lib/fluvial", str(self.broker.data_dir))
        run_shell(first_admin, self.cwd, {"FLUVIAL_NEW_PASSWORD": "admin-secret"})
        self.broker.start(timeout=60)
        return self

    def stop(self) -> None:
        self.broker.stop()
        self.mtls.stop()

    def adapt(self, code: str) -> str:
        ports = self.broker.ports
        return (code.replace(TLS_DIR, str(self.tls))
                .replace("localhost:9092", f"localhost:{self.broker.port}")
                .replace("localhost:9093", f"localhost:{self.mtls.port}")
                .replace("localhost:8081", f"localhost:{ports['http_port']}")
                .replace("localhost:8815", f"localhost:{ports['flight_port']}"))


def run_shell(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """A shell block with `fluvial` being this checkout's CLI (set -e: every command must succeed)."""
    fluvial = f"{sys.executable} -m fluvial.broker"
    script = "set -euo pipefail\n" + re.sub(r"(?m)^(\s*(?:\w+=\S+ )*)fluvial ", rf"\1{fluvial} ", code)
    done = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    assert done.returncode == 0, f"{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    return done.stdout


def test_security_guide_runs_as_written(tmp_path, capsys, request):
    text = DOC.read_text()
    all_blocks = blocks(text)
    python = [b for b in all_blocks if b.lang == "python" and not b.mark.startswith("not run")]
    shell = [b for b in all_blocks if b.mark == "run as shell"]
    assert guide_block("run before the broker starts")
    spark_blocks = [b for b in python if b.mark == "run with spark"]
    mtls_blocks = [b for b in python if b.mark == "run with the mtls broker"]
    assert len(mtls_blocks) == 1
    # A worked example for every client the guide promises, so none can be dropped unnoticed.
    code = "\n".join(b.code for b in python + shell)
    for client in ("confluent_kafka import", "aiokafka", "from kafka import", "SchemaRegistryClient",
                   "fc.connect", 'format("kafka")', 'format("fluvial")', "fluvial scan", "fluvial acl add"):
        assert client in code, f"the guide lost its runnable {client!r} example"
    assert len(spark_blocks) == 2

    guide = GuideBroker(tmp_path).start()
    workdir = guide.cwd
    namespace: dict = {"__name__": "security_guide"}
    spark = None
    try:
        outputs = []
        for i, block in enumerate(all_blocks):
            if block in shell:
                outputs.append(run_shell(guide.adapt(block.code), workdir))
            elif block in python:
                if block in spark_blocks and spark is None:
                    # The session every Spark test shares (skipped, saying why, without pyspark).
                    spark = namespace["spark"] = request.getfixturevalue("spark")
                if block in mtls_blocks:
                    guide.mtls.start(timeout=60)
                exec(compile(guide.adapt(block.code), f"security.md:block{i + 1}", "exec"), namespace)  # noqa: S102
        printed = capsys.readouterr().out
        # As the guide says: without a client certificate nothing gets through the mTLS listener.
        tls = {"bootstrap.servers": guide.mtls.bootstrap, "security.protocol": "SSL",
               "ssl.ca.location": str(guide.tls / "ca.pem"), "log_level": 0}
        errors: list = []
        anonymous = Producer({**tls, "message.timeout.ms": 5000, "on_delivery": lambda err, _m: errors.append(err)})
        anonymous.produce("audit", b"no certificate")
        anonymous.flush(15)
        assert len(errors) == 1 and errors[0] is not None
        check = Consumer({**tls, "group.id": "check", "ssl.certificate.location": str(guide.tls / "alice.pem"),
                          "ssl.key.location": str(guide.tls / "alice.key")})
        assert check.get_watermark_offsets(TopicPartition("audit", 0), timeout=15) == (0, 1)
        check.close()
    finally:
        guide.stop()

    # What the examples printed and left behind, checked here so that the guide's claims hold.
    assert len(namespace["seen"]) == 10                                 # confluent-kafka consumer
    assert b'{"amount": 11}' in namespace["values"]                     # kafka-python over PLAIN
    assert "User:alice is not authorized to CREATE" in printed        # the native client's refusal
    assert "\n2\n" in printed and "True" in printed                     # the native client's scans
    assert "200" in printed                                             # Spark's native source
    assert len(namespace["rows"]) == 12                                 # Spark's Kafka source: all of payments
    shell_out = "\n".join(outputs)
    assert "User:bob" in shell_out and "payments_daily" in shell_out and "2026-01-02" in shell_out
    assert "bob" in outputs[0] and "SCRAM-SHA-512" in outputs[0]       # fluvial user list
    assert "payments_avro-value" in outputs[-1]                         # fluvial schema list


def test_the_guides_warning_is_the_brokers(caplog):
    """The warning the guide quotes is what a broker bound to a non-loopback address with no
    authentication logs (the start itself is tested in test_security_config.py)."""
    from fluvial.security.config import SecurityConfig
    from fluvial.security.options import warn_if_open

    quoted = re.search(r"```\n(!!! SECURITY WARNING: .*?) \.\.\.\n```", DOC.read_text())
    assert quoted, "the guide no longer quotes the warning"
    with caplog.at_level("WARNING", logger="fluvial.security"):
        assert warn_if_open("0.0.0.0", SecurityConfig())
    assert caplog.records[-1].getMessage().startswith(quoted.group(1))
