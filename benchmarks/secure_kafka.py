"""Apache Kafka (KRaft, single node, from the jars) with a PLAINTEXT and a SASL_SSL listener, and the
client settings of each security protocol, for confluent-kafka and for Kafka's Java tools.

The SASL_SSL listener takes PEM files as they are (`ssl.keystore.type=PEM`, KIP-651): the
server's private key and certificate concatenated into one keystore file; clients trust the CA
with `ssl.truststore.type=PEM`. SCRAM credentials are written into the metadata log when the
storage is formatted (`kafka-storage.sh format --add-scram`), so the broker starts with them;
PLAIN users are listed in the listener's JAAS entry, as Kafka's own PlainLoginModule expects.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from benchmarks import kafka_dist
from benchmarks.brokers import (KAFKA, BrokerStartError, RunningBroker, SystemSpec, KAFKA_JVM_OPTS, free_port,
                                kraft_server_properties, random_cluster_id, wait_until_serving)

PLAINTEXT = "PLAINTEXT"
SASL_SSL = "SASL_SSL"
SCRAM_SHA_512 = "SCRAM-SHA-512"


@dataclass(frozen=True)
class Credentials:
    """A user and how a client proves it: SASL mechanism, name and password, and the CA it trusts."""

    mechanism: str
    username: str
    password: str
    ca_file: Path

    def confluent(self) -> dict[str, object]:
        """librdkafka's settings for SASL_SSL (confluent-kafka's Producer/Consumer/AdminClient)."""
        return {"security.protocol": SASL_SSL, "sasl.mechanism": self.mechanism,
                "sasl.username": self.username, "sasl.password": self.password,
                "ssl.ca.location": str(self.ca_file)}

    def jaas(self) -> str:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if self.mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        return f'{module} required username="{self.username}" password="{self.password}";'

    def java(self) -> dict[str, str]:
        """The Java client's properties for SASL_SSL, with a PEM trust store."""
        return {"security.protocol": SASL_SSL, "sasl.mechanism": self.mechanism,
                "sasl.jaas.config": self.jaas(),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca_file)}


def write_properties(path: Path, settings: dict[str, str]) -> Path:
    """A Java .properties file (as passed with --command-config / --producer.config)."""
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


def secure_server_properties(log_dir: Path, port: int, sasl_port: int, controller_port: int,
                             keystore: Path, plain_users: dict[str, str]) -> str:
    """The same single node as the plaintext benchmarks (brokers.kraft_server_properties) with a
    SASL_SSL listener beside the PLAINTEXT one; brokers and controller talk over PLAINTEXT."""
    base = kraft_server_properties(log_dir, port, controller_port)
    base = base.replace(f"listeners=PLAINTEXT://127.0.0.1:{port},",
                        f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port},", 1)
    base = base.replace(f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port}", 1)
    base = base.replace("listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL", 1)
    users = " ".join(f'user_{name}="{password}"' for name, password in plain_users.items())
    return base + f"""\
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256,PLAIN
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required {users};
ssl.keystore.type=PEM
ssl.keystore.location={keystore}
"""


@dataclass
class SecureKafka:
    """A started Kafka with both listeners; `broker.bootstrap` is the PLAINTEXT one."""

    broker: RunningBroker
    sasl_bootstrap: str

    def bootstrap(self, protocol: str) -> str:
        return self.sasl_bootstrap if protocol == SASL_SSL else self.broker.bootstrap

    def stop(self) -> None:
        self.broker.stop()


def start_secure_kafka(workdir: Path, server_cert: Path, server_key: Path, users: dict[str, str],
                       spec: SystemSpec = KAFKA, timeout_s: float = 120.0) -> SecureKafka:
    """`users` get SCRAM-SHA-512 and SCRAM-SHA-256 credentials and a PLAIN password."""
    workdir.mkdir(parents=True, exist_ok=True)
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    port, sasl_port, controller_port = sorted(ports)
    keystore = workdir / "server-keystore.pem"
    keystore.write_text(server_key.read_text() + server_cert.read_text())
    props = workdir / "server.properties"
    props.write_text(secure_server_properties(workdir / "kraft-logs", port, sasl_port, controller_port, keystore, users))
    scram = []
    for name, password in users.items():
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            scram += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    fmt = subprocess.run(kafka_dist.java_tool("kafka.tools.StorageTool", "format", "-t", random_cluster_id(),
                                              "-c", str(props), *scram, log_level="WARN"),
                         capture_output=True, text=True, timeout=120)
    if fmt.returncode != 0:
        raise BrokerStartError(f"kafka-storage format failed: {fmt.stderr[-2000:]}{fmt.stdout[-2000:]}")
    log_path = workdir / "kafka.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(kafka_dist.java_tool("kafka.Kafka", str(props), jvm_opts=KAFKA_JVM_OPTS, log_level="INFO"),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    broker = RunningBroker(spec=spec, bootstrap=f"127.0.0.1:{port}", pid=proc.pid, workdir=workdir,
                           log_path=log_path, version=kafka_dist.KAFKA_VERSION, _proc=proc, _log=log)
    try:
        wait_until_serving(broker.bootstrap, timeout_s, broker.alive)
    except BaseException:
        broker.stop()
        raise BrokerStartError(f"Apache Kafka did not start; log tail:\n{broker.log_tail()}")
    return SecureKafka(broker, f"127.0.0.1:{sasl_port}")
